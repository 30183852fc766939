"""A decode whose rows come and go: ``RunningDecode``, one state for every running row of a setting.

``dllm.generate`` decodes a fixed batch: its rows start together and the call lasts as long as its
longest row. A server's requests arrive one by one, so a running batch of several ``generate`` calls
pays each call's sampler step and commit once per step (continuous batching in
``dllm.serve.backends``). A ``RunningDecode`` instead holds every running row of one setting in ONE
canvas: a row joins (``add``) before any step and leaves after its last, and each ``step`` is one
forward, one sampler step and one commit for all rows, whatever block and step each row is at.

Rows are aligned on their current blocks: every row's current block ends at the same canvas column
E (each row padded left and right; explicit positions and a key-padding mask, as in ``generate``'s
ragged batches), so one window, the Wb columns left of E (Wb the widest current block), holds every
row's block; a narrower block's row has committed tokens or prompt left of it in the window, which
are no masks. When a row moves to its next block it is shifted left by that block's width (a roll of
its row), so that block ends at E; a row that joins with a longer prompt or answer pads the others,
and rows leaving trim the columns no row needs. Rows of one decode may have answers and prompts of
any length as long as they commit the same count per step (``group_of``).

Which decodes can run this way (``unsupported_reason``): a model without a block-causal mask, no
cache or Fast-dLLM's ``prefix`` / ``dual`` (``auto`` too), and a sampler whose step treats a row
alike at every step of its block (``Sampler.joins_mid_block``: ``threshold`` without
``schedule_steps``, ``eb``, ``localleap``, ``hierarchy``, ``lopa`` and ``fast``, whose rules read no
step index; ``low_confidence`` when its steps split every block evenly, so that every step commits
the same count); guidance (``cfg_scale``) without a cache or variant forwards, each row forwarded
again with its prompt masked (LLaDA's unconditional copy). A row then decodes to the tokens
``generate(..., stop_at_eos=True)`` gives its prompt alone, with its seed at temperature > 0 (each
row draws from its own generator what it draws alone: ``dllm.samplers.draws.WindowRows``, over its
own query), with its NFE (after a block that is not its last, a row whose answer holds an EOS with
no mask before it ends, its masks EOS); float32: equal logits up to summation order, the tolerance
of ``generate``'s own ragged batches (tests/test_running_decode.py).

Under a ``prefix`` or ``dual`` cache the decode also keeps the K/V buffers of its canvas
(``dllm.engine.running_canvas``), and a step forwards the rows at a full forward of their block in one
call and the other rows as the policy's cached query of their own block, one call per block width
(``dllm.engine.running_forwards``): a row's K/V are rewritten whole at its block's first step, so a
row that moves to its next block needs no roll of its buffers. A row's counts are its own call's:
its full forwards x its prompt + answer, its cached ones x its own query length.

LoPA's variant forwards (``StepInput.forward_variants``) are copies of their rows with the window's
tokens replaced, forwarded in the step's calls (under a cache: each row's block query against copies
of its buffers, as alone); with ``reuse`` a row whose block goes on carries its winner's
logits (``StepOutput.next_logits``) and runs no forward at its next step, while rows that joined or
moved to a new block are forwarded apart. Its NFE is alone's; its forwarded tokens too with static
variant batches (``compact=False``), while a compacted batch forwards as many variants for every row
as the row with the most candidates needs (``dllm.samplers.lopa``), so the row's count is then the
variants forwarded for it, at least alone's. With ``compact="block"`` (static batches, the variant
forward skipped where the anchor fills every row's block, tested at every step here: a running decode
has no step index) a row's tokens are alone's but not its NFE: it may share a variant forward that
another row needs, or skip one that alone, past its block's first step, it would run.

Host reads: a fixed-step sampler's blocks end after a known number of steps, so the answers are read
only at a step where a row's block ends or a caller watches its rows (``watch``); an adaptive
sampler's step reads them once (a block ends when it has no mask left). ``read`` (default: at once)
is how the reads are made, so a server can join them with its other decodes' reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Optional, Sequence

import torch

from dllm.cache.base import CachePolicy
from dllm.cache.block_causal import block_size_of
from dllm.cache.prefix_dual import DualCache, PrefixCache
from dllm.engine.forwards import takes_padded
from dllm.engine.progress import guarantee_progress
from dllm.engine.running_canvas import Blocks, RunningCanvas, RunningRow
from dllm.engine.running_forwards import RunningForwards
from dllm.inputs import model_device
from dllm.models.core.kv import KVCache
from dllm.rows import release_fill_id
from dllm.schedule import LOGIT_SHIFT_KEY
from dllm.samplers import make_sampler
from dllm.samplers.draws import WindowRows
from dllm.settings import DecodeSettings, check_call_seed, check_positions
from dllm.state import DecodeState, StepInput

Read = Callable[[list[torch.Tensor]], list[list]]
Split = Callable[[list[int]], list[list[int]]]  # rows' forward lengths, in row order -> runs of rows, one call each


def _read_now(tensors: list[torch.Tensor]) -> list[list]:
    return [t.tolist() for t in tensors]


def unsupported_reason(model, settings: DecodeSettings, gen_length: int) -> Optional[str]:
    """Why a row of ``settings`` and ``gen_length`` cannot join a ``RunningDecode`` on ``model`` (None:
    it can). The settings must be valid for the model (``DecodeSettings.resolve``; a refusal is raised
    as its ``SettingError``)."""
    return _check(model, settings, gen_length)[0]


def group_of(model, settings: DecodeSettings, gen_length: int) -> Optional[tuple]:
    """Rows of ``settings`` (seeds aside) that may share one decode have the same group: ``("fixed",
    k)`` for a fixed-step sampler committing k masks per step, ``("adaptive",)`` otherwise; None when
    the row cannot join one (``unsupported_reason``)."""
    return _check(model, settings, gen_length)[1]


Checked = tuple[Optional[str], Optional[tuple], Blocks, Optional[CachePolicy]]  # why not, group, blocks, cache


def _check(model, settings: DecodeSettings, gen_length: int) -> Checked:
    """(why not, the group, the answer's blocks, the cache policy or None) of a row: one ``resolve``."""
    if block_size_of(model) is not None:
        return "a block-causal model (its blocks are fixed by the checkpoint)", None, (), None
    resolved = settings.resolve(model, [[0]], gen_length)
    policy = resolved.policy if resolved.policy.uses_kv else None
    if policy is not None and not isinstance(policy, (PrefixCache, DualCache)):
        return (f"cache {policy.name!r} (a running decode serves the caches none, prefix, dual and presets of "
                f"them)"), None, (), None
    sampler, blocks = resolved.sampler, resolved.plan.blocks
    if not all(sampler.joins_mid_block(e - s, steps) for s, e, steps in blocks):
        return (f"sampler {sampler.name!r} with these options (its step depends on the step index or on "
                f"other rows: Sampler.joins_mid_block)"), None, (), None
    if settings.cfg_scale != 0 and (policy is not None or sampler.needs_variants):
        what = f"cache {policy.name!r}" if policy is not None else f"sampler {sampler.name!r}'s variant forwards"
        return (f"cfg_scale={settings.cfg_scale} with {what} (a running decode guides plain forwards only: a "
                f"second, unconditional copy of each row)"), None, (), None
    planned = tuple((s, e, steps or 0) for s, e, steps in blocks)
    if blocks[0][2] is None:
        return None, ("adaptive",), planned, policy
    per_step = {(e - s) // steps for s, e, steps in blocks}
    if len(per_step) != 1:
        return (f"sampler {sampler.name!r} with steps={settings.steps}: its blocks commit {sorted(per_step)} masks "
                f"per step (a running decode's rows commit one count)"), None, (), None
    return None, ("fixed", per_step.pop()), planned, policy


@dataclass
class RowStep:
    """One row after a step: its caller's ``tag``, its answer's ids when the step read them (None
    otherwise), whether it ended (no mask left; it has left the decode), and its counts as
    ``generate`` on its prompt alone reports them (forwards; forwarded tokens: the rows x query
    columns its own call's forwards would compute; LoPA's compacted variants: at least that)."""

    tag: Hashable
    ids: Optional[list[int]]
    done: bool
    nfe: int
    forwarded_tokens: int
    step: int = 0  # the step's index among the row's own steps (from 0), as its own call counts them
    block: int = 0  # the block it decoded
    canvas: Optional[list[int]] = None  # the answer as the step left it (masks and all) when ``ids`` differ
    #   from it: an EOS stop made its masks EOS in ``ids``


class RunningDecode(RunningCanvas, RunningForwards):
    """Every running row of one setting in one canvas (module docstring). ``add`` queues a row for the
    next step; ``step`` runs one forward, sampler step and commit for every row and returns each row's
    ``RowStep`` (ended rows leave); ``remove`` takes rows out before the next step. ``split``: how the
    step's forward is cut into calls (rows' forward lengths, in row order -> consecutive runs of rows;
    None: one call; under a cache the split is not used: its calls are the full and the cached rows)."""

    def __init__(self, model, settings: DecodeSettings, group: tuple, *, read: Read = _read_now,
                 split: Optional[Split] = None) -> None:
        if group != ("adaptive",) and not (isinstance(group, tuple) and len(group) == 2 and group[0] == "fixed"
                                            and isinstance(group[1], int) and group[1] >= 1):
            raise ValueError(f"group must be ('adaptive',) or ('fixed', k >= 1) (group_of), got {group!r}")
        self.per_step: Optional[int] = group[1] if group[0] == "fixed" else None  # masks a step commits
        self.model, self.settings, self.group, self.read, self.split = model, settings, group, read, split
        self.sampler = make_sampler(settings.sampler, **dict(settings.options))
        self._plans: dict[int, tuple[Optional[tuple], Blocks, Optional[CachePolicy]]] = {}  # gen_length -> _check[1:]
        self.policy: Optional[CachePolicy] = None  # the cache policy (set with the first row)
        self.kv: Optional[KVCache] = None  # [R, Hkv, L, hd] per layer under a cache
        self._kv_slices: Optional[tuple[KVCache, dict]] = None  # (the buffers, their row slices: _kv_rows)
        self._carried: Optional[torch.Tensor] = None  # [R, W, V] the logits a step's variants left (next_logits)
        self.temperature = float(settings.temperature)
        self.cfg_scale = float(settings.cfg_scale)  # > 0: each row also forwarded with its prompt masked
        self.mask_id = int(model.mask_id)
        self.pad_id = int(model.pad_id if model.pad_id is not None else model.eos_id)
        eos_ids = tuple(getattr(model, "eos_ids", ()) or ())
        self.eos_ids = frozenset(eos_ids)
        self.fill_id = release_fill_id(eos_ids, self.mask_id)  # what an EOS stop makes of a row's masks
        self.device = model_device(model)
        self.extras = {"eos_ids": eos_ids, LOGIT_SHIFT_KEY: int(getattr(model, "logit_shift", 0))}
        self._passes_padded = takes_padded(model)
        self.rows: list[RunningRow] = []
        self._joining: list[tuple[list[int], int, Optional[int], Hashable]] = []  # (prompt, gen_length, seed, tag)
        self._leaving: set[Hashable] = set()
        # [R, L] canvas, key-padding mask, positions and prompt columns; E: where every current block ends
        self.x = self.kpm = self.positions = self.prompt_mask = self._window = None
        self.block_end = 0  # E
        self.state: Optional[DecodeState] = None  # what the sampler reads, remade when the layout changes
        self._draws: Optional[WindowRows] = None  # the rows' generators over the window (temperature > 0)
        self._stale = True  # the canvas tensors or the window changed since the state was made
        self._calls: list[tuple[int, int, int, bool]] = []  # the step's forwards: (row0, row1, width, padded)
        self.forwards = 0  # steps run (each one forward of every row, in one call or more: ``split``)

    def __len__(self) -> int:
        """Rows still to decode: running and queued ones, less those leaving."""
        gone = self._leaving
        return sum(row.tag not in gone for row in self.rows) + sum(item[-1] not in gone for item in self._joining)

    def add(self, prompt_ids: Sequence[int], gen_length: int, tag: Hashable, seed: Optional[int] = None) -> None:
        """Queue a row (its prompt's ids, its answer's length) to join at the next step; ``tag`` names
        it in ``RowStep``. Its settings' ``group_of`` must be this decode's. ``seed`` (temperature > 0):
        the row draws what ``generate(seed=seed)`` draws for its prompt alone (None: a fresh seed)."""
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("a row needs a non-empty prompt")
        check_positions(self.model, len(ids), gen_length)
        check_call_seed(seed)
        if any(row.tag == tag for row in self.rows) or any(item[-1] == tag for item in self._joining):
            raise ValueError(f"a row tagged {tag!r} is already in this decode")
        group, _, policy = self._plan(gen_length)
        if group != self.group:
            raise ValueError(f"a row of gen_length={gen_length} is in group {group!r}, this decode's is "
                             f"{self.group!r} (dllm.engine.running.group_of)")
        self.policy = policy
        self._joining.append((ids, gen_length, seed, tag))

    def remove(self, tags: Sequence[Hashable]) -> None:
        """Rows that leave before their end (a cancel, a stop string): gone from the next step on."""
        self._leaving.update(tags)

    def _plan(self, gen_length: int) -> tuple[Optional[tuple], Blocks, Optional[CachePolicy]]:
        plan = self._plans.get(gen_length)
        if plan is None:
            plan = self._plans[gen_length] = _check(self.model, self.settings, gen_length)[1:]
        return plan

    @property
    def window(self) -> int:
        """Wb: the widest current block; the window is the Wb columns left of E."""
        return max((row.width for row in self.rows), default=0)

    def _regroup(self) -> None:
        """Apply the queued leaves and joins, then remake the sampler's state if the layout changed."""
        leaving = self._leaving
        if leaving:
            self._leaving = set()
            self._joining = [item for item in self._joining if item[-1] not in leaving]
            keep = [i for i, row in enumerate(self.rows) if row.tag not in leaving]
            if len(keep) < len(self.rows):
                self._keep(keep)
        if self._joining:
            self._join()
        if self._stale:
            self._remake_state()

    def _remake_state(self) -> None:
        """The ``DecodeState`` the sampler reads: one block, the window, at its start (a fixed-step
        sampler sees Wb / k steps of k masks each: its commit count; a ``joins_mid_block`` sampler
        reads no more of a row's progress than its canvas)."""
        self._stale = False
        if not self.rows:
            self.state = None
            return
        e, w, n = self.block_end, self.window, len(self.rows)
        s = e - w
        self._draws = None if self.temperature == 0 else WindowRows(
            tuple(row.generator for row in self.rows), tuple(w - row.width for row in self.rows),
            widths=tuple(row.width for row in self.rows), window=w,
            queries=tuple((row.prompt_length + row.gen_length, row.prompt_length + row.blocks[row.block][0],
                           row.prompt_length + row.end) for row in self.rows))
        self._window = self.x[:, s:e]  # [R, Wb] each row's current block at its end, written in place
        self.state = DecodeState(
            x=self.x, key_padding_mask=self.kpm, positions=self.positions, prompt_mask=self.prompt_mask,
            prompt_length=s, gen_length=self.x.shape[1] - s, mask_id=self.mask_id, temperature=self.temperature,
            generator=self._draws, trace=self.x.new_full((n, self.x.shape[1] - s), -1),  # not kept: no commit steps
            padded=any(row.left > 0 or row.left + row.prompt_length + row.gen_length < self.x.shape[1]
                       for row in self.rows), block_start=s, block_end=e, block_length=w,
            block_steps=None if self.per_step is None else w // self.per_step,
            block_masks_at_start=self.x.new_full((n,), w) if self.sampler.reads_block_masks else None,
            extras=dict(self.extras))
        self.sampler.begin_block(self.state)
        self._calls = self._plan_calls() if self.kv is None else []

    def step(self, watch: bool = False) -> list[RowStep]:
        """One forward, sampler step and commit for every row (after the queued joins and leaves).
        ``watch``: read every row's answer (``RowStep.ids``) even where no block ends. Rows that end
        leave the decode. Returns one ``RowStep`` per row of this step, in row order."""
        self._regroup()
        state = self.state
        if state is None:
            return []
        w = state.block_length
        carried, self._carried = self._carried, None
        if carried is not None and any(row.carried for row in self.rows):
            logits = self._with_carried(carried)  # [R, Wb, V]
        elif self.kv is None:
            parts = [self._forward(*call) for call in self._calls]
            logits = parts[0] if len(parts) == 1 else torch.cat(parts)  # [R, Wb, V]
            for row in self.rows:
                row.forwarded += (row.prompt_length + row.gen_length) * (2 if self.cfg_scale > 0 else 1)
                row.nfe += 1
        else:
            logits = self._cached_logits()  # [R, Wb, V]
        self.forwards += 1
        window = self._window  # [R, Wb]
        active = window == self.mask_id  # [R, Wb]: left of a narrower block are no masks
        inp = StepInput(logits=logits, tokens=window, active=active, query_start=state.block_start,
                        window=(0, w), step=0, steps=state.block_steps, mask_id=self.mask_id,
                        temperature=self.temperature, generator=self._draws,
                        forward_variants=self._variant_forward if self.sampler.needs_variants else None)
        decision = self.sampler.step(inp, state)
        if decision.next_logits is not None:  # LoPA's reuse: the rows still in their block read them next
            self._carried = decision.next_logits  # [R, Wb, V]
        commit = guarantee_progress(decision, active, last=False,
                                     adaptive=self.per_step is None and not self.sampler.commits_every_step)
        torch.where(commit, decision.tokens, window, out=window)  # in place: the canvas view
        return self._after_step(watch)

    def _after_step(self, watch: bool) -> list[RowStep]:
        """Count the step, read the answers where needed, end blocks and rows, move rows on."""
        k = self.per_step
        for row in self.rows:
            row.steps += 1
            row.block_step += 1
            row.carried = False
        ends = [k is not None and row.block_step * k >= row.width for row in self.rows]
        a0 = min(row.answer for row in self.rows)
        ids = self.read([self.x[:, a0:]])[0] if watch or k is None or any(ends) else None
        out, moving = [], []
        for r, row in enumerate(self.rows):
            answer = None if ids is None else ids[r][row.answer - a0:row.answer - a0 + row.gen_length]
            s_b, e_b, _ = row.blocks[row.block]
            block_done = ends[r] if k is not None else self.mask_id not in answer[s_b:e_b]
            if k is None and not block_done and row.block_step >= self.sampler.max_block_steps(row.width):
                raise RuntimeError(f"a row still has masks after {row.block_step} steps of a block of {row.width}; "
                                   f"sampler {self.sampler!r} broke progress")
            done = block_done and (row.block + 1 == len(row.blocks) or self.answer_ended(answer))
            canvas = None
            if done and self.mask_id in answer:  # an EOS stop: its masks become EOS, as generate's release
                canvas, answer = answer, [self.fill_id if t == self.mask_id else t for t in answer]
            out.append(RowStep(row.tag, answer, done, row.nfe, row.forwarded, row.steps - 1, row.block, canvas))
            if done:
                self._leaving.add(row.tag)
            elif block_done:
                moving.append(r)
            else:
                row.carried = self._carried is not None
        for r in moving:
            self._advance(r)
        if moving:
            self._trim()
            if self.kv is not None:  # a row at a narrower last block
                self._sort_rows()
        if all(st.done for st in out):  # every row ended: nothing to keep until a next join
            self._regroup()
        return out

    def answer_ended(self, answer: list[int]) -> bool:
        """``stop_at_eos``'s rule: the answer's ids hold an EOS/EoT with no mask before it."""
        for t in answer:
            if t == self.mask_id:
                return False
            if t in self.eos_ids:
                return True
        return False


__all__ = ["RowStep", "RunningDecode", "group_of", "unsupported_reason"]
