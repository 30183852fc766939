"""The forwards of a ``RunningDecode`` step (``dllm.engine.running``): logits of the window for every row.

Without a cache every row is forwarded over the canvas' last columns it needs, in calls of
consecutive rows (the caller's ``split``). Under a ``prefix`` or ``dual`` cache, the rows at a full
forward of their block (its first step, or the policy's ``refresh`` / ``warmup`` steps) are one call
over the canvas that rewrites their K/V rows, and the others are the policy's cached query of their
own block against the buffers, one call per run of rows of one block width (rows are kept by width),
through slices of the buffers. A sampler's variant forwards (LoPA) are copies of their rows (under
a cache, each row's block query against copies of its buffers, ``KVCache.rows_view``), and rows that
carry the logits their last step's variants left run no forward.
``RunningForwards`` is a mixin of ``RunningDecode``.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from typing import Any, Optional, Union

import torch

from dllm.engine.forwards import guided, with_unconditional
from dllm.models.core.kv import KVCache
from dllm.schedule import LOGIT_SHIFT_KEY


class RunningForwards:
    """The step's forwards of ``RunningDecode`` (module docstring)."""

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
        x = cut(self.x)
        if self.cfg_scale > 0:  # LLaDA's guidance: the unconditional copies (prompt and pads masked) follow
            x, kwargs["positions"], kwargs["key_padding_mask"] = with_unconditional(
                x, cut(self.prompt_mask), self.mask_id, kwargs["positions"], kwargs["key_padding_mask"])
            return guided(self.model(x, **kwargs).logits, self.cfg_scale)
        if padded and self._passes_padded:
            kwargs["padded"] = True  # the mask has padding: the model need not read it back
        return self.model(x, **kwargs).logits

    def _cached_logits(self, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [R, Wb, V] of the window under a cache: the rows at a full forward (``is_refresh``
        of their block's step) over the whole canvas, the others as the policy's cached query of their
        block, one call per block width (a narrower block's logits padded on the left: no masks there).
        ``out``: the step's logits where some rows carry theirs (``_with_carried``): only the other rows
        are forwarded, into it."""
        assert self.policy is not None and self.kv is not None
        state, policy, shift = self.state, self.policy, self.extras[LOGIT_SHIFT_KEY]
        e, length, wb = state.block_end, self.x.shape[1], state.block_length
        take = [out is None or not row.carried for row in self.rows]
        full = [t and policy.is_refresh(row.block_step) for t, row in zip(take, self.rows)]
        queries = []
        for row, t, is_full in zip(self.rows, take, full):  # its own call's query: the canvas, or its cached one
            own, bs, be = row.own_block
            r0, r1 = (0, own) if is_full else policy.cached_span(own, bs, be, shift)
            if t:
                row.forwarded += r1 - r0
                row.nfe += 1
            queries.append((r1 - r0, bs - r0, be - r0))
        if self._draws is not None:  # a row draws over its own query, as alone (chunked.window_uniforms)
            self._draws = self.state.generator = dataclasses.replace(self._draws, queries=tuple(queries))
        # the cached rows of one width are runs of rows (rows are kept by width: ``_sort_rows``), each
        # forwarded through slices of the buffers; the rows at a full forward in one call of their own
        cached = [row.width if t and not is_full else 0 for row, t, is_full in zip(self.rows, take, full)]
        runs = []  # (first row, end row, width) of each run of cached rows of one width
        for w, run in itertools.groupby(range(len(cached)), key=cached.__getitem__):
            run = list(run)
            if w:
                runs.append((run[0], run[-1] + 1, w))
        pieces = [(r0, r1, self._kv_forward(slice(r0, r1), *policy.cached_span(length, e - w, e, shift), e - w))
                  for r0, r1, w in runs]  # (first row, end row, logits [n, w, V])
        fulls = [r for r, is_full in enumerate(full) if is_full]
        idx = scattered = None
        if fulls:  # from the leftmost of their first columns (what is left of it is padding of theirs) or
            a = min(min(self.rows[r].left for r in fulls), e - wb - shift)  # the window's (past the shift)
            if fulls == list(range(fulls[0], fulls[-1] + 1)):
                pieces.append((fulls[0], fulls[-1] + 1, self._kv_forward(slice(fulls[0], fulls[-1] + 1), a, length,
                                                                         e - wb)))
            else:
                idx = torch.tensor(fulls, device=self.device)  # one upload: the rows of the call
                scattered = self._kv_forward(idx, a, length, e - wb)  # [len(fulls), Wb, V]
        if out is None and idx is None:  # every row forwarded, the calls tile the rows: one cat in row order,
            pieces.sort(key=lambda piece: piece[0])  # a narrower block's logits padded on the left (no masks)
            parts = [torch.nn.functional.pad(p, (0, 0, wb - p.shape[1], 0)) if p.shape[1] < wb else p
                     for _, _, p in pieces]
            return parts[0] if len(parts) == 1 else torch.cat(parts)
        logits = out
        if logits is None:
            first = pieces[0][2] if pieces else scattered
            logits = first.new_empty((len(self.rows), wb, first.shape[-1]))
        for r0, r1, part in pieces:
            w = part.shape[1]
            if w < wb:
                logits[r0:r1, :wb - w] = 0  # left of a narrower block: no masks there
            logits[r0:r1, wb - w:] = part
        if idx is not None:
            logits.index_copy_(0, idx, scattered)
        return logits

    def _cached_variants(self, rows: list[int], idx: torch.Tensor, tokens: torch.Tensor, group: int) -> torch.Tensor:
        """``_variant_forward`` under a cache: each row's variants as its block's cached query against
        copies of its buffers (``KVCache.rows_view``: the forward of the later step each stands for, as
        alone), one call per run of rows of one block width -> [N, Wb, V]."""
        state, policy, shift = self.state, self.policy, self.extras[LOGIT_SHIFT_KEY]
        e, length, wb = state.block_end, self.x.shape[1], state.block_length
        parts, j0 = [], 0
        for w, run in itertools.groupby(rows, key=lambda r: self.rows[r].width):  # rows are kept by width
            run = list(run)
            j = j0 + len(run)
            sub = slice(j0 * group, j * group)
            a, b = policy.cached_span(length, e - w, e, shift)
            lo = max(a, e - wb)  # the window's columns in the query: the variants' tokens
            x = self.x[:, a:b].index_select(0, idx[sub])  # [n, b - a] a copy
            x[:, lo - a:e - a] = tokens[sub, lo - (e - wb):]
            kwargs: dict[str, Any] = {"positions": self.positions[:, a:b].index_select(0, idx[sub]),
                                      "cache": self.kv.rows_view(idx[sub], a, length, None, group),
                                      "logits_rows": (e - w - a, e - a)}
            if state.padded:
                kwargs["key_padding_mask"] = self.kpm.index_select(0, idx[sub])
            part = self.model(x, **kwargs).logits  # [n, w, V]
            parts.append(torch.nn.functional.pad(part, (0, 0, wb - w, 0)) if w < wb else part)
            for r in run:  # as alone: its variants x its cached query
                row = self.rows[r]
                r0, r1 = policy.cached_span(*row.own_block, shift)
                row.nfe += 1
                row.forwarded += group * (r1 - r0)
            j0 = j
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _rows_forward(self, rows: list[int], idx: torch.Tensor, tokens: Optional[torch.Tensor] = None,
                      group: int = 1) -> torch.Tensor:
        """Logits [N, Wb, V] of the window for the batch rows ``idx`` [N] (``rows``: the distinct ones,
        ascending, on the host; each ``group`` times in runs), forwarded without a cache in the step's
        calls (``split``: the rows of a call together, from the leftmost of their first columns);
        ``tokens`` [N, Wb]: the window's tokens of each (verification variants), else the canvas'.
        Counts one forward of each row, ``group`` x its length."""
        starts = [call[0] for call in self._calls]  # the first row of each of the step's calls
        parts, j0 = [], 0
        for _, run in itertools.groupby(rows, key=lambda r: bisect.bisect_right(starts, r)):  # by call
            run = list(run)
            sub = slice(j0 * group, (j0 + len(run)) * group)
            parts.append(self._rows_call(run, idx[sub], None if tokens is None else tokens[sub]))
            j0 += len(run)
        for r in rows:
            row = self.rows[r]
            row.nfe += 1
            row.forwarded += group * (row.prompt_length + row.gen_length)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _rows_call(self, rows: list[int], idx: torch.Tensor, tokens: Optional[torch.Tensor]) -> torch.Tensor:
        """One call of ``_rows_forward``: the batch rows ``idx`` [n] of the distinct ``rows``."""
        state, shift = self.state, self.extras[LOGIT_SHIFT_KEY]
        s, e = state.block_start, state.block_end
        a = min(min(self.rows[r].left for r in rows), s - shift)
        x = self.x[:, a:].index_select(0, idx)  # [n, L - a] a copy
        if tokens is not None:
            x[:, s - a:e - a] = tokens
        kwargs: dict[str, Any] = {"positions": self.positions[:, a:].index_select(0, idx),
                                  "logits_rows": (s - a, e - a)}
        if state.padded:
            kwargs["key_padding_mask"] = self.kpm[:, a:].index_select(0, idx)
            if self._passes_padded:
                kwargs["padded"] = True
        return self.model(x, **kwargs).logits

    def _with_carried(self, carried: torch.Tensor) -> torch.Tensor:
        """The step's logits [R, Wb, V] when some rows carry the logits their last step's variants left
        (``StepOutput.next_logits``, [R, W', V] as the window was then: each row's block at its right
        end): those rows run no forward; the others (joined, or at a new block) are forwarded."""
        wb, wc = self.state.block_length, carried.shape[1]
        if wc == wb and all(row.carried for row in self.rows):  # nothing to forward or write into them: the
            # very object the sampler handed on (LoPA then reads the statistics it kept of it)
            return carried if self.kv is None else self._cached_logits(out=carried)
        logits = carried[:, wc - wb:] if wc >= wb else torch.nn.functional.pad(carried, (0, 0, wb - wc, 0))
        if self.kv is not None:
            return self._cached_logits(out=logits)
        fresh = [r for r, row in enumerate(self.rows) if not row.carried]
        if fresh:
            idx = torch.tensor(fresh, device=self.device)  # one upload: the rows of the call
            logits = logits.index_copy(0, idx, self._rows_forward(fresh, idx))
        return logits

    def _variant_forward(self, tokens: torch.Tensor, rows: torch.Tensor, group: int = 1, *,
                         every_row: bool = False, host_rows: Optional[list[int]] = None) -> torch.Tensor:
        """``StepInput.forward_variants``: copies of the batch rows ``rows`` [N] (runs of ``group``
        variants of one row) whose window holds ``tokens`` [N, Wb] -> the window's logits [N, Wb, V].
        ``every_row``: the runs are every row in order; else ``host_rows`` are the runs' rows, or they
        are read back."""
        if every_row:
            distinct = list(range(len(self.rows)))
        else:
            distinct = list(host_rows) if host_rows is not None else rows[::group].tolist()
        if self.kv is not None:
            return self._cached_variants(distinct, rows, tokens, group)
        return self._rows_forward(distinct, rows, tokens, group)

    def _kv_rows(self, rows: slice) -> KVCache:
        """The buffers' rows ``rows`` as a ``KVCache`` of slices (views: a forward writes and reads them in
        place), made once per buffers object: every change of the rows' layout makes new buffers."""
        kv, memo = self.kv, self._kv_slices
        assert kv is not None
        if memo is None or memo[0] is not kv:
            memo = self._kv_slices = (kv, {})
        key = (rows.start, rows.stop)
        sub = memo[1].get(key)
        if sub is None:
            sub = memo[1][key] = KVCache([t[rows] for t in kv.k], [t[rows] for t in kv.v])
        return sub

    def _kv_forward(self, rows: Union[slice, torch.Tensor], a: int, b: int, s: int) -> torch.Tensor:
        """Logits [N, E - s, V] of columns ``[s, E)`` for the ``rows`` (a slice of rows, or their indices
        [N]) from a forward of canvas columns ``[a, b)`` that writes their K/V and attends to the
        buffers' ``[0, L)``."""
        state, length, kv = self.state, self.x.shape[1], self.kv
        x, positions, kpm = self.x[:, a:b], self.positions[:, a:b], self.kpm if state.padded else None
        if isinstance(rows, torch.Tensor):
            x, positions, kpm = x[rows], positions[rows], None if kpm is None else kpm[rows]
            view = kv.held_view(rows, a, length)
        elif rows.indices(len(self.rows))[:2] == (0, len(self.rows)):
            view = kv.view(a, length)
        else:  # slices of the buffers: the forward writes and reads them in place
            x, positions, kpm = x[rows], positions[rows], None if kpm is None else kpm[rows]
            view = self._kv_rows(rows).view(a, length)
        head = (s - a, state.block_end - a)
        return self.model(x, positions=positions, key_padding_mask=kpm, cache=view, logits_rows=head).logits


__all__ = ["RunningForwards"]
