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

Which decodes can run this way (``unsupported_reason``): no guidance, a model without a block-causal
mask, no cache or Fast-dLLM's ``prefix`` / ``dual`` (``auto`` too), and a sampler whose step treats a
row alike at every step of its block (``Sampler.joins_mid_block``: ``threshold``
without ``schedule_steps``, ``eb``, ``localleap`` and ``hierarchy``, whose rules read no step index;
``low_confidence`` when its steps split every block evenly, so that every step commits the same
count). A row then decodes to the tokens ``generate(..., stop_at_eos=True)`` gives its prompt alone,
with its seed at temperature > 0 (each row draws from its own generator what it draws alone:
``dllm.samplers.draws.WindowRows``), with its NFE (after a block that is not its last, a row whose answer holds an EOS with no mask before
it ends, its masks EOS); float32: equal logits up to summation order, the tolerance of ``generate``'s
own ragged batches (tests/test_running_decode.py).

Under a ``prefix`` or ``dual`` cache the decode keeps K/V buffers of its canvas ([R, Hkv, L, hd] per
layer, padded, trimmed and reordered with its rows). A step forwards its rows in up to two calls: the
rows at a full forward of their block (its first step, or the policy's ``refresh`` / ``warmup``
steps) over the whole canvas, writing their K/V rows, and the others as the policy's cached query of
their block against the buffers, one call per block width (a narrower block's row queries its own
block, as alone: the window's columns left of it stay cached), through ``KVCache.held_view`` when not
every row is in the call. A row's K/V are rewritten whole at its block's first step, so a row that
moves to its next block (a roll of its tokens) needs no roll of its buffers. A row's counts are its
own call's: its full forwards x its prompt + answer, its cached ones x its own query length.

Host reads: a fixed-step sampler's blocks end after a known number of steps, so the answers are read
only at a step where a row's block ends or a caller watches its rows (``watch``); an adaptive
sampler's step reads them once (a block ends when it has no mask left). ``read`` (default: at once)
is how the reads are made, so a server can join them with its other decodes' reads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Sequence

import torch

from dllm.cache.base import CachePolicy
from dllm.cache.block_causal import block_size_of
from dllm.cache.prefix_dual import DualCache, PrefixCache
from dllm.engine.forwards import takes_padded
from dllm.engine.loop import _guarantee_progress
from dllm.inputs import model_device
from dllm.models.core.kv import KVCache
from dllm.rows import release_fill_id
from dllm.schedule import LOGIT_SHIFT_KEY
from dllm.samplers import make_sampler
from dllm.samplers.draws import WindowRows, fresh_seed
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


Blocks = tuple[tuple[int, int, int], ...]  # an answer's blocks as ``generate`` plans them: (start, end, steps or 0)
Checked = tuple[Optional[str], Optional[tuple], Blocks, Optional[CachePolicy]]  # why not, group, blocks, cache


def _check(model, settings: DecodeSettings, gen_length: int) -> Checked:
    """(why not, the group, the answer's blocks, the cache policy or None) of a row: one ``resolve``."""
    if settings.cfg_scale != 0:
        return f"cfg_scale={settings.cfg_scale} (guidance forwards a second copy of each row)", None, (), None
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
    ``generate`` on its prompt alone reports them (forwards; forwarded tokens: forwards x its own length)."""

    tag: Hashable
    ids: Optional[list[int]]
    done: bool
    nfe: int
    forwarded_tokens: int


@dataclass
class _Row:
    tag: Hashable
    prompt_length: int
    gen_length: int
    blocks: Blocks  # the answer's blocks, in answer columns
    left: int = 0  # canvas column of the row's first token (its prompt's first)
    block: int = 0  # the current block
    block_step: int = 0  # steps taken in it
    steps: int = 0  # steps taken in all
    forwarded: int = 0  # tokens its own call would have forwarded so far
    generator: Optional[torch.Generator] = None  # its own draws (temperature > 0)

    @property
    def end(self) -> int:
        """The current block's end, in answer columns."""
        return self.blocks[self.block][1]

    @property
    def width(self) -> int:
        return self.blocks[self.block][1] - self.blocks[self.block][0]

    @property
    def answer(self) -> int:
        """Canvas column of the row's first answer position."""
        return self.left + self.prompt_length


class RunningDecode:
    """Every running row of one setting in one canvas (module docstring). ``add`` queues a row for the
    next step; ``step`` runs one forward, sampler step and commit for every row and returns each row's
    ``RowStep`` (ended rows leave); ``remove`` takes rows out before the next step. ``split``: how the
    step's forward is cut into calls (rows' forward lengths, in row order -> consecutive runs of rows;
    None: one call; under a cache the split is not used: its calls are the full and the cached rows)."""

    def __init__(self, model, settings: DecodeSettings, group: tuple, *, read: Read = _read_now,
                 split: Optional[Split] = None) -> None:
        if group not in (("adaptive",),) and not (len(group) == 2 and group[0] == "fixed" and group[1] >= 1):
            raise ValueError(f"group must be ('adaptive',) or ('fixed', k >= 1) (group_of), got {group!r}")
        self.per_step: Optional[int] = group[1] if group[0] == "fixed" else None  # masks a step commits
        self.model, self.settings, self.group, self.read, self.split = model, settings, group, read, split
        self.sampler = make_sampler(settings.sampler, **dict(settings.options))
        self._plans: dict[int, tuple[Optional[tuple], Blocks, Optional[CachePolicy]]] = {}  # gen_length -> _check[1:]
        self.policy: Optional[CachePolicy] = None  # the cache policy (set with the first row)
        self.kv: Optional[KVCache] = None  # [R, Hkv, L, hd] per layer under a cache
        self.temperature = float(settings.temperature)
        self.mask_id = int(model.mask_id)
        self.pad_id = int(model.pad_id if model.pad_id is not None else model.eos_id)
        eos_ids = tuple(getattr(model, "eos_ids", ()) or ())
        self.eos_ids = frozenset(eos_ids)
        self.fill_id = release_fill_id(eos_ids, self.mask_id)  # what an EOS stop makes of a row's masks
        self.device = model_device(model)
        self.extras = {"eos_ids": eos_ids, LOGIT_SHIFT_KEY: int(getattr(model, "logit_shift", 0))}
        self._passes_padded = takes_padded(model)
        self.rows: list[_Row] = []
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

    # ---- the rows' canvas --------------------------------------------------------------------
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

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor],
               kv_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
        """``fn`` of each [R, L] tensor of the canvas: ids, key-padding mask, positions, prompt columns;
        ``kv_fn`` of each K/V buffer [R, Hkv, L, hd] (None: ``fn``, which then takes rows only)."""
        self.x, self.kpm, self.positions, self.prompt_mask = (
            fn(t) for t in (self.x, self.kpm, self.positions, self.prompt_mask))
        if self.kv is not None:
            kv_fn = kv_fn or fn
            self.kv = KVCache([kv_fn(t) for t in self.kv.k], [kv_fn(t) for t in self.kv.v])

    def _pad(self, left: int, right: int) -> None:
        """Pad every row ``left`` columns on the left and ``right`` on the right."""
        if left or right:
            pad = torch.nn.functional.pad
            self.x = pad(self.x, (left, right), value=self.pad_id)
            self.kpm = pad(self.kpm, (left, right), value=False)
            self.positions = pad(self.positions, (left, right), value=0)
            self.prompt_mask = pad(self.prompt_mask, (left, right), value=True)
            if self.kv is not None:  # zeros: a padding key is masked, and 0 x a finite value is 0
                self.kv = KVCache([pad(t, (0, 0, left, right)) for t in self.kv.k],
                                  [pad(t, (0, 0, left, right)) for t in self.kv.v])
            for row in self.rows:
                row.left += left
            self.block_end += left
            self._stale = True

    def _trim(self) -> None:
        """Drop the columns no row needs: left of every row, right of every answer."""
        if not self.rows:
            self.x = self.kpm = self.positions = self.prompt_mask = self._window = self.kv = None
            self.block_end, self.state = 0, None
            return
        c0 = min(row.left for row in self.rows)
        c1 = self.block_end + max(row.gen_length - row.end for row in self.rows)
        if c0 or c1 < self.x.shape[1]:
            self._apply(lambda t: t[:, c0:c1], lambda t: t[:, :, c0:c1].contiguous())
            for row in self.rows:
                row.left -= c0
            self.block_end -= c0
            self._stale = True

    def _keep(self, keep: list[int]) -> None:
        """Only rows ``keep`` stay (one upload of their indices)."""
        self.rows = [self.rows[i] for i in keep]
        if keep:
            idx = torch.tensor(keep, device=self.device)
            self._apply(lambda t: t.index_select(0, idx))
        self._stale = True
        self._trim()

    def _join(self) -> None:
        """Append the queued rows, each padded so that its first block ends at column E (the others
        padded further when a joining row reaches further left or right)."""
        joining, self._joining = self._joining, []
        new = [_Row(tag, len(ids), g, self._plan(g)[1], generator=self._generator(seed)) for ids, g, seed, tag in joining]
        if self.x is None:
            self.x = self.kpm = self.positions = self.prompt_mask = torch.zeros((0, 0), dtype=torch.long,
                                                                                device=self.device)
            self.kpm, self.prompt_mask = self.kpm.bool(), self.prompt_mask.bool()
            if self.policy is not None:
                self.kv = self.model.new_kv_cache(0, 0)
        e_old, right_old = self.block_end, self.x.shape[1] - self.block_end
        e_new = max([e_old] + [row.prompt_length + row.end for row in new])
        right_new = max([right_old] + [row.gen_length - row.end for row in new])
        self._pad(e_new - e_old, right_new - right_old)
        width = e_new + right_new
        ids_rows, kpm_rows, pos_rows, prompt_rows = [], [], [], []
        for (ids, g, _, _), row in zip(joining, new):
            row.left = e_new - row.prompt_length - row.end
            right = width - row.left - len(ids) - g
            ids_rows.append([self.pad_id] * row.left + ids + [self.mask_id] * g + [self.pad_id] * right)
            kpm_rows.append([0] * row.left + [1] * (len(ids) + g) + [0] * right)
            pos_rows.append([0] * row.left + list(range(len(ids) + g)) + [0] * right)
            prompt_rows.append([1] * (row.left + len(ids)) + [0] * g + [1] * right)
        t = torch.tensor([ids_rows, kpm_rows, pos_rows, prompt_rows], dtype=torch.long, device=self.device)
        self.x = torch.cat([self.x, t[0]])
        self.kpm = torch.cat([self.kpm, t[1].bool()])
        self.positions = torch.cat([self.positions, t[2]])
        self.prompt_mask = torch.cat([self.prompt_mask, t[3].bool()])
        if self.kv is not None:  # a joining row's K/V are written by its first step, a full forward
            self.kv = KVCache([torch.cat([b, b.new_zeros((len(new), *b.shape[1:]))]) for b in self.kv.k],
                              [torch.cat([b, b.new_zeros((len(new), *b.shape[1:]))]) for b in self.kv.v])
        self.rows.extend(new)
        self._sort_rows()
        self.block_end = e_new
        self._stale = True

    def _sort_rows(self) -> None:
        """Rows by length (the step's calls take runs of rows), under a cache by their block's width
        first (a cached call takes the rows of one width)."""
        def key(r: int) -> tuple[int, int]:
            row = self.rows[r]
            return (row.width if self.kv is not None else 0), row.prompt_length + row.gen_length
        order = sorted(range(len(self.rows)), key=key)
        if order != list(range(len(self.rows))):
            idx = torch.tensor(order, device=self.device)
            self._apply(lambda t: t.index_select(0, idx))
            self.rows = [self.rows[r] for r in order]
            self._stale = True

    def _generator(self, seed: Optional[int]) -> Optional[torch.Generator]:
        """A row's own generator (temperature > 0): seeded as ``generate(seed=...)`` seeds it."""
        if self.temperature == 0:
            return None
        return torch.Generator(device=self.device).manual_seed(fresh_seed() if seed is None else seed)

    def _advance(self, r: int) -> None:
        """Row ``r`` moves to its next block: shifted left by that block's width (a roll of its row),
        so that the block ends at E. Its K/V buffers stay: its next step is a full forward."""
        row = self.rows[r]
        row.block, row.block_step = row.block + 1, 0
        shift = row.width
        if row.left < shift:  # not enough columns left of it: pad every row
            self._pad(shift - row.left, 0)
        for t in (self.x, self.kpm, self.positions, self.prompt_mask):
            t[r].copy_(t[r].roll(-shift))  # the pads it rolls out of the left come in on the right
        row.left -= shift
        self._stale = True  # its calls' widths, maybe the window

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
            block_masks_at_start=self.x.new_full((n,), w), extras=dict(self.extras))
        self.sampler.begin_block(self.state)
        self._calls = self._plan_calls() if self.kv is None else []

    def _plan_calls(self) -> list[tuple[int, int, int, bool]]:
        """The step's forwards: ``split`` of the rows' lengths (the canvas right of each row's left
        edge, at least the window and what follows it, and a shifted family's first column), every
        call a run of rows over the canvas' last ``width`` columns."""
        length, s = self.x.shape[1], self.state.block_start
        floor = length - s + self.extras[LOGIT_SHIFT_KEY]  # logits_rows needs a >= the shift
        need = [min(max(length - row.left, floor), length) for row in self.rows]
        groups = [list(range(len(need)))] if self.split is None else self.split(need)
        calls, r0 = [], 0
        for group in groups:
            if group != list(range(r0, r0 + len(group))) or not group:
                raise ValueError(f"split must return consecutive runs of rows in order, got {groups!r}")
            r1 = r0 + len(group)
            width = max(need[r0:r1])
            padded = any(row.left > length - width or row.left + row.prompt_length + row.gen_length < length
                         for row in self.rows[r0:r1])
            calls.append((r0, r1, width, padded))
            r0 = r1
        if r0 != len(need):
            raise ValueError(f"split must cover every row once, got {groups!r} for {len(need)} rows")
        return calls

    # ---- one step ----------------------------------------------------------------------------
    def _forward(self, r0: int, r1: int, width: int, padded: bool) -> torch.Tensor:
        """Logits [r1 - r0, Wb, V] of the window for rows ``[r0, r1)``, forwarded over the canvas' last
        ``width`` columns (the whole canvas for one call of every row)."""
        length, state = self.x.shape[1], self.state
        whole = (r0, r1, width) == (0, self.x.shape[0], length)

        def cut(t: torch.Tensor) -> torch.Tensor:
            return t if whole else t[r0:r1, length - width:]
        a = width - (length - state.block_start)  # the window's first column in the call
        kwargs: dict[str, Any] = {"positions": cut(self.positions), "logits_rows": (a, a + state.block_length),
                                  "key_padding_mask": cut(self.kpm) if padded else None}
        if padded and self._passes_padded:
            kwargs["padded"] = True  # the mask has padding: the model need not read it back
        return self.model(cut(self.x), **kwargs).logits

    def _cached_logits(self) -> torch.Tensor:
        """Logits [R, Wb, V] of the window under a cache: the rows at a full forward (``is_refresh``
        of their block's step) over the whole canvas, the others as the policy's cached query of their
        block, one call per block width (a narrower block's logits padded on the left: no masks there)."""
        assert self.policy is not None and self.kv is not None
        state, policy, shift = self.state, self.policy, self.extras[LOGIT_SHIFT_KEY]
        e, length, wb = state.block_end, self.x.shape[1], state.block_length
        full = [policy.is_refresh(row.block_step) for row in self.rows]
        parts, queries = [], []
        for row, is_full in zip(self.rows, full):  # its own call's query: the canvas, or its cached query
            own, bs, be = (row.prompt_length + n for n in (row.gen_length, row.blocks[row.block][0], row.end))
            r0, r1 = (0, own) if is_full else policy.cached_span(own, bs, be, shift)
            row.forwarded += r1 - r0
            queries.append((r1 - r0, bs - r0, be - r0))
        if self._draws is not None:  # a row draws over its own query, as alone (chunked.window_uniforms)
            self._draws = self.state.generator = dataclasses.replace(self._draws, queries=tuple(queries))
        # the cached rows of one width are runs of rows (rows are kept by width: ``_sort_rows``), each
        # forwarded through slices of the buffers; the rows at a full forward in one call of their own
        runs: list[tuple[int, int, int]] = []  # (first row, end row, width)
        for r, (row, is_full) in enumerate(zip(self.rows, full)):
            if not is_full:
                if runs and runs[-1][1] == r and runs[-1][2] == row.width:
                    runs[-1] = (runs[-1][0], r + 1, row.width)
                else:
                    runs.append((r, r + 1, row.width))
        fulls = [r for r, is_full in enumerate(full) if is_full]
        if runs == [(0, len(self.rows), wb)]:  # every row cached, one width: one call, no copy
            return self._kv_forward(0, len(self.rows), *policy.cached_span(length, e - wb, e, shift), e - wb)
        logits = None
        for r0, r1, w in runs:
            part = self._kv_forward(r0, r1, *policy.cached_span(length, e - w, e, shift), e - w)  # [N, w, V]
            if logits is None:
                logits = part.new_empty((len(self.rows), wb, part.shape[-1]))
            logits[r0:r1, :wb - w] = 0  # left of a narrower block: no masks there
            logits[r0:r1, wb - w:] = part
        if fulls:  # from the leftmost of their first columns (what is left of it is padding of theirs) or
            a = min(min(self.rows[r].left for r in fulls), e - wb - shift)  # the window's (past the shift)
            if fulls == list(range(fulls[0], fulls[-1] + 1)):
                part = self._kv_forward(fulls[0], fulls[-1] + 1, a, length, e - wb)
                if logits is None:
                    return part
                logits[fulls[0]:fulls[-1] + 1] = part
            else:
                idx = torch.tensor(fulls, device=self.device)  # one upload: the rows of the call
                part = self._kv_forward(0, 0, a, length, e - wb, idx)
                logits = part.new_empty((len(self.rows), *part.shape[1:])) if logits is None else logits
                logits.index_copy_(0, idx, part)
        return logits

    def _kv_forward(self, r0: int, r1: int, a: int, b: int, s: int, idx: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [N, E - s, V] of columns ``[s, E)`` for rows ``[r0, r1)`` (or the rows ``idx`` [N]) from
        a forward of canvas columns ``[a, b)`` that writes their K/V and attends to the buffers' ``[0, L)``."""
        state, length, kv = self.state, self.x.shape[1], self.kv
        x, positions, kpm = self.x[:, a:b], self.positions[:, a:b], self.kpm if state.padded else None
        if idx is not None:
            x, positions, kpm = x[idx], positions[idx], None if kpm is None else kpm[idx]
            view = kv.held_view(idx, a, length)
        elif (r0, r1) == (0, len(self.rows)):
            view = kv.view(a, length)
        else:  # slices of the buffers: the forward writes and reads them in place
            x, positions, kpm = x[r0:r1], positions[r0:r1], None if kpm is None else kpm[r0:r1]
            view = KVCache([t[r0:r1] for t in kv.k], [t[r0:r1] for t in kv.v]).view(a, length)
        head = (s - a, state.block_end - a)
        return self.model(x, positions=positions, key_padding_mask=kpm, cache=view, logits_rows=head).logits

    def step(self, watch: bool = False) -> list[RowStep]:
        """One forward, sampler step and commit for every row (after the queued joins and leaves).
        ``watch``: read every row's answer (``RowStep.ids``) even where no block ends. Rows that end
        leave the decode. Returns one ``RowStep`` per row of this step, in row order."""
        self._regroup()
        state = self.state
        if state is None:
            return []
        w = state.block_length
        if self.kv is None:
            parts = [self._forward(*call) for call in self._calls]
            logits = parts[0] if len(parts) == 1 else torch.cat(parts)  # [R, Wb, V]
            for row in self.rows:
                row.forwarded += row.prompt_length + row.gen_length
        else:
            logits = self._cached_logits()  # [R, Wb, V]
        self.forwards += 1
        window = self._window  # [R, Wb]
        active = window == self.mask_id  # [R, Wb]: left of a narrower block are no masks
        inp = StepInput(logits=logits, tokens=window, active=active, query_start=state.block_start,
                        window=(0, w), step=0, steps=state.block_steps, mask_id=self.mask_id,
                        temperature=self.temperature, generator=self._draws)
        decision = self.sampler.step(inp, state)
        commit = _guarantee_progress(decision, active, last=False,
                                     adaptive=self.per_step is None and not self.sampler.commits_every_step)
        torch.where(commit, decision.tokens, window, out=window)  # in place: the canvas view
        return self._after_step(watch)

    def _after_step(self, watch: bool) -> list[RowStep]:
        """Count the step, read the answers where needed, end blocks and rows, move rows on."""
        k = self.per_step
        for row in self.rows:
            row.steps += 1
            row.block_step += 1
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
            done = block_done and (row.block + 1 == len(row.blocks) or self._answer_ended(answer))
            if done and self.mask_id in answer:  # an EOS stop: its masks become EOS, as generate's release
                answer = [self.fill_id if t == self.mask_id else t for t in answer]
            out.append(RowStep(row.tag, answer, done, row.steps, row.forwarded))
            if done:
                self._leaving.add(row.tag)
            elif block_done:
                moving.append(r)
        for r in moving:
            self._advance(r)
        if moving:
            self._trim()
            if self.kv is not None:  # a row at a narrower last block
                self._sort_rows()
        if all(st.done for st in out):  # every row ended: nothing to keep until a next join
            self._regroup()
        return out

    def _answer_ended(self, answer: list[int]) -> bool:
        """``stop_at_eos``'s rule after a block: an EOS/EoT with no mask before it."""
        for t in answer:
            if t == self.mask_id:
                return False
            if t in self.eos_ids:
                return True
        return False


__all__ = ["RowStep", "RunningDecode", "group_of", "unsupported_reason"]
