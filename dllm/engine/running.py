"""A decode whose rows come and go: ``RunningDecode``, one state for every running row of a setting.

``dllm.generate`` decodes a fixed batch: its rows start together and the call lasts as long as its
longest row. A server's requests arrive one by one, so a running batch of several ``generate`` calls
pays each call's sampler step and commit once per step (continuous batching in
``dllm.serve.backends``). A ``RunningDecode`` instead holds every running row of one setting in ONE
canvas: a row joins (``add``) before any step and leaves after its last, and each ``step`` is one
forward, one sampler step and one commit for all rows, whatever step each row is at.

Rows are aligned on their ends: every row's answer ends at the canvas' last column (each row
left-padded, explicit positions and a key-padding mask, as in ``generate``'s ragged batches), so one
window, the last W columns (W the longest answer), holds every row's answer: a shorter answer's row
has prompt tokens left of it in the window, which are no masks. A longer row pads the others further
left when it joins; rows leaving trim the columns no row needs. Rows of one decode may have answers
of any length as long as they commit the same count per step (``group_of``).

Which decodes can run this way (``unsupported_reason``): greedy (temperature 0), no guidance, no KV
cache (every step forwards the whole canvas), one block (``block_length`` >= ``gen_length``), a model
without a block-causal mask, and a sampler whose step treats a row alike at every step of its block
(``Sampler.joins_mid_block``: ``threshold`` without ``schedule_steps``, ``eb``, ``localleap`` and
``hierarchy``, whose rules read no step index; ``low_confidence`` when its steps split the answer
evenly, so that every step commits the same count: rows of one decode then commit the same count,
their answers may differ in length).
A row then decodes to the tokens ``generate`` gives its prompt alone (float32: equal logits up to
summation order, the tolerance of ``generate``'s own ragged batches; tests/test_running_decode.py).

Host reads: a fixed-step sampler's rows end after a known number of steps, so the canvas is read
only at a step where a row ends or a caller watches its rows (``watch``); an adaptive sampler's step
reads the answers once (a row ends when it has no mask left). ``read`` (default: at once) is how the
reads are made, so a server can join them with its other decodes' reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Sequence

import torch

from dllm.cache.block_causal import block_size_of
from dllm.engine.forwards import takes_padded
from dllm.engine.loop import _guarantee_progress
from dllm.inputs import model_device
from dllm.schedule import LOGIT_SHIFT_KEY
from dllm.samplers import make_sampler
from dllm.settings import DecodeSettings
from dllm.state import DecodeState, StepInput

Read = Callable[[list[torch.Tensor]], list[list]]
Split = Callable[[list[int]], list[list[int]]]  # rows' forward lengths (ascending) -> groups of rows, one call each


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


def _check(model, settings: DecodeSettings, gen_length: int) -> tuple[Optional[str], Optional[tuple]]:
    if settings.temperature != 0:
        return f"temperature={settings.temperature} (sampled rows draw over their own canvas)", None
    if settings.cfg_scale != 0:
        return f"cfg_scale={settings.cfg_scale} (guidance forwards a second copy of each row)", None
    if block_size_of(model) is not None:
        return "a block-causal model (its blocks are fixed by the checkpoint)", None
    resolved = settings.resolve(model, [[0]], gen_length)
    if resolved.policy.name != "none":
        return f"cache {resolved.policy.name!r} (a running decode forwards the whole canvas every step)", None
    if len(resolved.plan.blocks) != 1:
        return f"block_length={settings.block_length} < gen_length={gen_length} (one block per answer only)", None
    s, e, steps = resolved.plan.blocks[0]
    if not resolved.sampler.joins_mid_block(e - s, steps):
        return (f"sampler {resolved.sampler.name!r} with these options (its step depends on the step index "
                f"or on other rows: Sampler.joins_mid_block)"), None
    return None, ("adaptive",) if steps is None else ("fixed", (e - s) // steps)


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
    steps: int = 0


class RunningDecode:
    """Every running row of one setting in one canvas (module docstring). ``add`` queues a row for the
    next step; ``step`` runs one forward, sampler step and commit for every row and returns each row's
    ``RowStep`` (ended rows leave); ``remove`` takes rows out before the next step."""

    def __init__(self, model, settings: DecodeSettings, group: tuple, *, read: Read = _read_now,
                 split: Optional[Split] = None) -> None:
        if group not in (("adaptive",),) and not (len(group) == 2 and group[0] == "fixed" and group[1] >= 1):
            raise ValueError(f"group must be ('adaptive',) or ('fixed', k >= 1) (group_of), got {group!r}")
        self.model, self.settings, self.group, self.read, self.split = model, settings, group, read, split
        self.sampler = make_sampler(settings.sampler, **dict(settings.options))
        self._groups: dict[int, Optional[tuple]] = {}  # gen_length -> group_of (resolved once per length)
        self.per_step: Optional[int] = group[1] if group[0] == "fixed" else None  # masks a step commits
        self.mask_id = int(model.mask_id)
        self.pad_id = int(model.pad_id if model.pad_id is not None else model.eos_id)
        self.max_positions = getattr(model, "max_positions", None)
        self.device = model_device(model)
        self.extras = {"eos_ids": tuple(getattr(model, "eos_ids", ()) or ()),
                       LOGIT_SHIFT_KEY: int(getattr(model, "logit_shift", 0))}
        self._passes_padded = takes_padded(model)
        self.rows: list[_Row] = []
        self._joining: list[tuple[list[int], int, Hashable]] = []
        self._leaving: set[Hashable] = set()
        # [R, L] canvas, key-padding mask, positions and prompt columns; [R, W] the window's view
        self.x = self.kpm = self.positions = self.prompt_mask = self._answers = None
        self.state: Optional[DecodeState] = None  # what the sampler reads, remade when the rows change
        self._calls: list[tuple[int, int, int, bool]] = []  # the step's forwards: (row0, row1, width, padded)
        self.forwards = 0  # steps run (each one forward of every row, in one call or more: ``split``)

    def __len__(self) -> int:
        """Rows still to decode: running and queued ones, less those leaving."""
        gone = self._leaving
        return sum(row.tag not in gone for row in self.rows) + sum(tag not in gone for *_, tag in self._joining)

    def add(self, prompt_ids: Sequence[int], gen_length: int, tag: Hashable) -> None:
        """Queue a row (its prompt's ids, its answer's length) to join at the next step; ``tag`` names
        it in ``RowStep``. Its settings' ``group_of`` must be this decode's."""
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("a row needs a non-empty prompt")
        if self.max_positions is not None and len(ids) + gen_length > self.max_positions:
            raise ValueError(f"prompt ({len(ids)} tokens) + gen_length ({gen_length}) exceeds the model's "
                             f"{self.max_positions} positions")
        if any(row.tag == tag for row in self.rows) or any(item[-1] == tag for item in self._joining):
            raise ValueError(f"a row tagged {tag!r} is already in this decode")
        group = self._groups.get(gen_length, ())
        if group == ():
            group = self._groups[gen_length] = group_of(self.model, self.settings, gen_length)
        if group != self.group:
            raise ValueError(f"a row of gen_length={gen_length} is in group {group!r}, this decode's is "
                             f"{self.group!r} (dllm.engine.running.group_of)")
        self._joining.append((ids, gen_length, tag))

    def remove(self, tags: Sequence[Hashable]) -> None:
        """Rows that leave before their end (a cancel, a stop string): gone from the next step on."""
        self._leaving.update(tags)

    # ---- the rows' canvas --------------------------------------------------------------------
    @property
    def answer_width(self) -> int:
        """W: the longest answer of a row in the canvas; the window is the canvas' last W columns."""
        return max((row.gen_length for row in self.rows), default=0) if self.x is not None else 0

    def _regroup(self) -> None:
        """Apply the queued leaves and joins (one new canvas for both) and remake the sampler's state."""
        leaving = self._leaving
        if leaving:
            self._leaving = set()
            keep = [i for i, row in enumerate(self.rows) if row.tag not in leaving]
            self._joining = [item for item in self._joining if item[-1] not in leaving]
            if len(keep) < len(self.rows):
                self._keep(keep)
        if self._joining:
            self._join()
        if leaving or self.state is None or self.state.batch_size != len(self.rows):
            self._remake_state()

    def _keep(self, keep: list[int]) -> None:
        """Only rows ``keep`` stay; the columns left of every kept row are trimmed."""
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.x = self.kpm = self.positions = self.prompt_mask = self._answers = None
            return
        idx = torch.tensor(keep, device=self.device)  # the kept rows (one upload, when rows leave)
        c0 = self.x.shape[1] - max(row.prompt_length + row.gen_length for row in self.rows)
        self.x, self.kpm, self.positions, self.prompt_mask = (
            t.index_select(0, idx)[:, c0:] for t in (self.x, self.kpm, self.positions, self.prompt_mask))

    def _join(self) -> None:
        """Append the queued rows, each left-padded so that its answer ends at the canvas' last column
        (the others padded further left when a joining row is longer)."""
        joining, self._joining = self._joining, []
        length = 0 if self.x is None else self.x.shape[1]
        new_length = max([length] + [len(ids) + g for ids, g, _ in joining])
        ids_rows, kpm_rows, pos_rows, prompt_rows = [], [], [], []
        for ids, g, tag in joining:
            pad = new_length - len(ids) - g
            ids_rows.append([self.pad_id] * pad + ids + [self.mask_id] * g)
            kpm_rows.append([0] * pad + [1] * (len(ids) + g))
            pos_rows.append([0] * pad + list(range(len(ids) + g)))
            prompt_rows.append([1] * (pad + len(ids)) + [0] * g)
        new = torch.tensor([ids_rows, kpm_rows, pos_rows, prompt_rows], dtype=torch.long, device=self.device)
        x, kpm, pos, prompt = new[0], new[1].bool(), new[2], new[3].bool()  # [n, L] each
        if self.x is not None:
            grow = new_length - length  # pad the running rows further left
            if grow:
                pad = torch.nn.functional.pad
                self.x = pad(self.x, (grow, 0), value=self.pad_id)
                self.kpm = pad(self.kpm, (grow, 0), value=False)
                self.positions = pad(self.positions, (grow, 0), value=0)
                self.prompt_mask = pad(self.prompt_mask, (grow, 0), value=True)
            x, kpm = torch.cat([self.x, x]), torch.cat([self.kpm, kpm])
            pos, prompt = torch.cat([self.positions, pos]), torch.cat([self.prompt_mask, prompt])
        self.rows.extend(_Row(tag, len(ids), g) for ids, g, tag in joining)
        order = sorted(range(len(self.rows)), key=lambda r: self.rows[r].prompt_length + self.rows[r].gen_length)
        if order != list(range(len(self.rows))):  # rows by length: the step's calls take row ranges
            idx = torch.tensor(order, device=self.device)
            x, kpm, pos, prompt = (t.index_select(0, idx) for t in (x, kpm, pos, prompt))
            self.rows = [self.rows[r] for r in order]
        self.x, self.kpm, self.positions, self.prompt_mask = x, kpm, pos, prompt

    def _remake_state(self) -> None:
        """The ``DecodeState`` the sampler reads: one block, the canvas' last W columns, at its start
        (a fixed-step sampler sees W / k steps of k masks each: its commit count; a ``joins_mid_block``
        sampler reads no more of a row's progress than its canvas: a shorter answer's window columns
        left of it are its prompt, never a mask)."""
        if not self.rows:
            self.state = None
            return
        length, w, n = self.x.shape[1], self.answer_width, len(self.rows)
        s = length - w
        self._answers = self.x[:, s:]  # [R, W] the window (each row's answer at its end), written in place
        self.state = DecodeState(
            x=self.x, key_padding_mask=self.kpm, positions=self.positions, prompt_mask=self.prompt_mask,
            prompt_length=s, gen_length=w, mask_id=self.mask_id, temperature=0.0, generator=None,
            trace=self.x.new_full((n, w), -1),  # not kept: a running decode reports no commit steps
            padded=any(row.prompt_length + row.gen_length < length for row in self.rows), block_start=s,
            block_end=length, block_length=w, block_steps=None if self.per_step is None else w // self.per_step,
            block_masks_at_start=self.x.new_full((n,), w), extras=dict(self.extras))
        self.sampler.begin_block(self.state)
        self._calls = self._plan_calls(length, w)

    def _plan_calls(self, length: int, w: int) -> list[tuple[int, int, int, bool]]:
        """The step's forwards: ``split`` of the rows' lengths (each at least the window and a shifted
        family's first column), every call a range of rows over the canvas' last ``width`` columns."""
        floor = w + self.extras[LOGIT_SHIFT_KEY]  # logits_rows needs a >= the shift
        need = [max(row.prompt_length + row.gen_length, floor) for row in self.rows]  # ascending
        groups = [list(range(len(need)))] if self.split is None else self.split(need)
        calls, r0 = [], 0
        for group in groups:
            if group != list(range(r0, r0 + len(group))) or not group:
                raise ValueError(f"split must return consecutive runs of rows in order, got {groups!r}")
            r1 = r0 + len(group)
            width = min(max(need[r0:r1]), length)
            padded = any(row.prompt_length + row.gen_length < width for row in self.rows[r0:r1])
            calls.append((r0, r1, width, padded))
            r0 = r1
        if r0 != len(need):
            raise ValueError(f"split must cover every row once, got {groups!r} for {len(need)} rows")
        return calls

    # ---- one step ----------------------------------------------------------------------------
    def _forward(self, r0: int, r1: int, width: int, padded: bool, w: int) -> torch.Tensor:
        """Logits [r1 - r0, W, V] of the window for rows ``[r0, r1)``, forwarded over the canvas' last
        ``width`` columns (the whole canvas for one call of every row)."""
        length = self.x.shape[1]
        whole = (r0, r1, width) == (0, self.x.shape[0], length)
        def cut(t: torch.Tensor) -> torch.Tensor:
            return t if whole else t[r0:r1, length - width:]
        kwargs: dict[str, Any] = {"positions": cut(self.positions), "logits_rows": (width - w, width),
                                  "key_padding_mask": cut(self.kpm) if padded else None}
        if padded and self._passes_padded:
            kwargs["padded"] = True  # the mask has padding: the model need not read it back
        return self.model(cut(self.x), **kwargs).logits


    def step(self, watch: bool = False) -> list[RowStep]:
        """One forward, sampler step and commit for every row (after the queued joins and leaves).
        ``watch``: read every row's answer (``RowStep.ids``) even where no row ends. Rows that end
        leave the decode. Returns one ``RowStep`` per row of this step, in row order."""
        self._regroup()
        state = self.state
        if state is None:
            return []
        s, w = state.block_start, state.gen_length
        parts = [self._forward(*call, w) for call in self._calls]
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)  # [R, W, V]
        self.forwards += 1
        answers = self._answers  # [R, W]
        active = answers == self.mask_id  # [R, W]: a right pad is no mask
        inp = StepInput(logits=logits, tokens=answers, active=active, query_start=s, window=(0, w), step=0,
                        steps=state.block_steps, mask_id=self.mask_id, temperature=0.0, generator=None)
        decision = self.sampler.step(inp, state)
        commit = _guarantee_progress(decision, active, last=False,
                                     adaptive=self.per_step is None and not self.sampler.commits_every_step)
        torch.where(commit, decision.tokens, answers, out=answers)  # in place: the canvas view
        for row in self.rows:
            row.steps += 1
        k = self.per_step
        ends = [k is not None and row.steps * k >= row.gen_length for row in self.rows]
        ids = self.read([answers])[0] if watch or k is None or any(ends) else None
        out = []
        for r, row in enumerate(self.rows):
            mine = None if ids is None else ids[r][w - row.gen_length:]  # the row's answer ends the window
            done = ends[r] if k is not None else self.mask_id not in mine
            if k is None and not done and row.steps >= self.sampler.max_block_steps(row.gen_length):
                raise RuntimeError(f"a row still has masks after {row.steps} steps of a block of {row.gen_length}; "
                                   f"sampler {self.sampler!r} broke progress")
            out.append(RowStep(row.tag, mine, done, row.steps, row.steps * (row.prompt_length + row.gen_length)))
            if done:
                self._leaving.add(row.tag)
        if all(st.done for st in out):  # every row ended: nothing to keep until a next join
            self._regroup()
        return out


__all__ = ["RowStep", "RunningDecode", "group_of", "unsupported_reason"]
