"""The three kinds of forward a decode step runs (``dllm.engine.Decode`` inherits them).

``forward``: the query's columns (a cache policy's ``Query``: the whole canvas, or a slice against
the K/V buffers), with the rows still held (``dllm.rows``), a captured CUDA graph when there is one,
and a sampler's soft inputs for the block. ``shadow_forward``: the same with a shadow block (WINO's
leave-one-out views). ``variant_forward``: verification variants of some rows, through copies of
their K/V rows. Each counts NFE and forwarded tokens; classifier-free guidance runs on a doubled batch
(``guided``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Optional

import torch

from dllm.cache.base import Query
from dllm.models.base import DiffusionLM
from dllm.rows import forward_held, forward_rows


def takes_padded(model) -> bool:
    """Whether ``model``'s forward takes ``padded`` (``dllm.models.base``'s does; a served model's
    wrapper passes every keyword through); a model of another kind is not given it."""
    forward = getattr(type(model), "forward", None)
    return forward is not None and _takes(forward, "padded")


@functools.lru_cache(maxsize=None)
def _takes(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class StepForwards:
    """The forwards of one ``generate`` call (``dllm.engine.Decode``): reads ``model``, ``state``,
    ``policy``, ``cfg_scale``, ``shift``, ``attn_layers``, ``skip_released``, ``graphs``, ``views`` and
    the block's soft inputs (``_soft``) from the instance."""

    def query_inputs(self, query: Query) -> tuple[torch.Tensor, dict]:
        """The forward batch of the query columns ``[query.start, query.end)``: input_ids [R, Q] and
        the keyword arguments shared by ``forward`` and ``shadow_forward`` (positions, the
        canvas-wide padding mask, the cache view). Under CFG, R = 2B: the unconditional copy
        (prompt -> mask, pads too) follows the conditional rows; else R = B."""
        state = self.state
        if query.extra is None:  # [start, end): views taken once per block
            x, positions = self.views.get("x", query.start, query.end), self.views.get("positions", query.start,
                                                                                         query.end)
        else:
            cols = query.columns()  # the policy's extra columns, then [start, end)
            x, positions = state.x[:, cols], state.positions[:, cols]  # [B, Q]
        kpm = state.key_padding_mask if state.padded else None  # [B, L] canvas-wide
        if self.cfg_scale > 0:
            x, positions, kpm = with_unconditional(x, state.prompt_mask[:, query.columns()], state.mask_id,
                                                   positions, kpm)
        kwargs = {"positions": positions, "key_padding_mask": kpm}
        if state.kv is not None:
            kwargs["cache"] = self._cache_view(query)
        return x, kwargs

    def _cache_view(self, query: Query):
        """The query's view of the buffers; without extra columns one per block, reused by every step
        of the block with the same positions view (a forward may keep what it derives from them)."""
        kv = self.state.kv
        if query.extra is not None:
            return kv.view(query.start, query.key_end, query.extra)
        return self.views.memo(("kv", query.start, query.key_end),
                               lambda: kv.view(query.start, query.key_end, reuse=True))

    def forward(self, query: Query,
                rows: Optional[tuple[int, int]] = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Logits [B, Q, V] for the query columns (and the attention maps the sampler asked for);
        with ``rows=(a, b)`` (query coordinates) only those rows' logits, [B, b - a, V].

        Without buffers (``cache="none"``) this is a plain full forward. With buffers, the forward
        writes its rows' K/V into them and attends to ``[0, query.key_end)`` (``dllm.models.core.kv``).
        """
        x, kwargs = self.query_inputs(query)
        rows = query.head_rows(rows)
        if rows is not None:
            kwargs["logits_rows"] = rows
        soft = self._soft_inputs(query, x.shape[0])
        if soft is not None:  # every row is forwarded, eagerly: the graphs and held rows take token inputs
            kwargs["soft_inputs"] = soft
        held = None if soft is not None else forward_rows(self.state, x.shape[0], cache=kwargs.get("cache"),
                                                          wants_maps=bool(self.attn_layers),
                                                          skip_released=self.skip_released)
        logits = self._graphed(query, x, kwargs, rows) if held is None and soft is None else None
        if logits is not None:
            attn: dict[int, torch.Tensor] = {}
        else:
            view = kwargs.get("cache")
            if held is None and view is not None and soft is None and not self.attn_layers and isinstance(
                    self.model, DiffusionLM):  # the model itself (not a served model's wrapper): no module call
                logits, attn = self.model.cached_logits(x, kwargs["positions"], kwargs["key_padding_mask"], view,
                                                        rows), {}
            else:
                if held is None:
                    if kwargs["key_padding_mask"] is not None and view is None and takes_padded(self.model):
                        kwargs["padded"] = True  # every row of a left-padded batch: the mask is not read back
                    out = self.model(x, want_attn_layers=self.attn_layers, **kwargs)
                else:  # released rows (dllm.rows) are not computed
                    out = forward_held(self.model, x, kwargs, held)
                logits, attn = out.logits, {k: v[:, :, query.n_extra:] for k, v in out.attn.items()}  # query rows
        if self.cfg_scale > 0:
            b = self.state.batch_size
            logits = guided(logits, self.cfg_scale)
            attn = {k: v[:b] for k, v in attn.items()}
        self._count((x.shape[0] if held is None else held.numel()) * query.length)  # rows computed x query
        return logits, attn

    def _soft_inputs(self, query: Query, n_rows: int):
        """The block's soft inputs (``StepOutput.soft``) placed at the query's rows (past its extra
        columns; under CFG the unconditional copies take them too), or None."""
        if self._soft is None:
            return None
        c0, soft = self._soft
        if not query.start <= c0 <= c0 + soft.width <= query.end:
            raise RuntimeError(f"the query [{query.start}, {query.end}) does not cover the soft inputs of "
                               f"columns [{c0}, {c0 + soft.width})")
        if n_rows != soft.where.shape[0]:
            soft = soft.rows(torch.arange(soft.where.shape[0], device=soft.where.device).repeat(2))
        return soft.at(query.n_extra + c0 - query.start)

    def _graphed(self, query: Query, x: torch.Tensor, kwargs: dict,
                 rows: Optional[tuple[int, int]]) -> Optional[torch.Tensor]:
        """The forward through ``self.graphs`` when it is a capturable cached forward (a query slice
        against the buffers, no extra columns, no attention maps), else None."""
        g = self.graphs
        if g is None or self.attn_layers or query.n_extra or (query.start == 0 and query.end == query.key_end):
            return None
        return g.forward(x, kwargs["positions"], kwargs["key_padding_mask"], query.start, query.key_end, rows)

    def shadow_forward(self, query: Query, s: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, Q, V] of the query columns, leave-one-out logits [B, e - s, V]) from one
        forward with a shadow block (``DiffusionLM.shadow_forward``), against the buffers when the
        call has them; counted as one NFE of Q + W rows per row."""
        x, kwargs = self.query_inputs(query)
        logits, shadow = self.model.shadow_forward(x, start=s, end=e, **kwargs)
        if self.cfg_scale > 0:
            logits, shadow = guided(logits, self.cfg_scale), guided(shadow, self.cfg_scale)
        self._count(x.shape[0] * (query.length + e - s))
        return logits, shadow

    def variant_forward(self, tokens: torch.Tensor, rows: torch.Tensor, group: int = 1, *,
                        every_row: bool = False, host_rows: Optional[list[int]] = None) -> torch.Tensor:
        """Verification variants (``Sampler.needs_variants``; one NFE per call): forwards of copies
        of the batch rows ``rows`` [N] whose columns of the step's view (the query, or the block for a
        ``reads_block_only`` sampler) hold ``tokens`` [N, Q].

        Cache ``none``: full forwards. With buffers: the policy's cached query of this block against
        copies of the rows' buffers, one layer at a time (``KVCache.rows_view``), i.e. exactly the
        forward of the later step each variant stands for (``CachePolicy.variant_refusal``). Returns the logits of the
        block window only, [N, W, V] (``[:, k]`` predicts canvas column ``block_start + k``):
        verification reads nothing else, and a [N, L, V] copy per variant would not fit a long
        canvas with a 126k vocabulary. ``group`` > 1: ``rows`` is in runs of ``group`` variants of
        one row, which share one copy of its buffers per layer (``RowsView.attend``). ``every_row``:
        the caller knows the runs are every batch row in order (``rows`` = each of 0..B-1 ``group``
        times), so the layers read the rows' buffers as they are instead of gathering a copy.
        ``host_rows``: the runs' rows on the host, when the sampler has them (not needed here).
        """
        state = self.state
        v0 = self._view_start  # tokens cover the step's view: canvas columns [v0, v0 + Q)
        length = state.x.shape[1]
        vq = Query(0, length, length) if state.kv is None else self.policy.cached_query(state, self.shift)
        s, e = state.block_start, state.block_end
        assert vq.start <= s and e <= vq.end, "every query covers the block it decodes"
        cols, head = vq.columns(), vq.head_rows((s - vq.start, e - vq.start))
        self._count(rows.shape[0] * vq.length * (2 if self.cfg_scale > 0 else 1))
        if self.stacks_variants(group, vq):
            return self._stacked_variants(tokens, rows, group, every_row, vq, cols, head)
        x = state.x[rows].clone()  # [N, L]
        x[:, v0:v0 + tokens.shape[1]] = tokens
        kpm = state.key_padding_mask[rows] if state.padded else None
        positions = state.positions[rows]
        kv_rows = rows
        if self.cfg_scale > 0:
            x, positions, kpm = with_unconditional(x, state.prompt_mask[rows], state.mask_id, positions, kpm)
            kv_rows = torch.cat([rows, rows + state.batch_size])  # the unconditional half's buffers
        extra = {} if state.kv is None else {"cache": state.kv.rows_view(kv_rows, vq.start, vq.key_end, vq.extra,
                                                                         group, every_row=every_row)}
        out = self.model(x[:, cols], positions=positions[:, cols], key_padding_mask=kpm, logits_rows=head,
                         **extra)  # the window only
        return guided(out.logits, self.cfg_scale) if self.cfg_scale > 0 else out.logits  # [N, W, V]

    def stacks_variants(self, group: int, vq: Query) -> bool:
        """Whether runs of ``group`` variants are forwarded as one sequence per row (``StackedView``):
        under buffers, without extra columns or guidance, on a model whose head takes row ranges."""
        return (self.state.kv is not None and group > 1 and vq.extra is None and self.cfg_scale == 0
                and getattr(self.model, "supports_head_rows", False))

    def _stacked_variants(self, tokens: torch.Tensor, rows: torch.Tensor, group: int, every_row: bool, vq: Query,
                          cols: slice, head: tuple[int, int]) -> torch.Tensor:
        """``variant_forward`` of runs of ``group`` variants as one sequence of ``group`` x Q queries
        per row (``StackedView``: the same logits without the per-layer reshapes) -> [N, W, V]."""
        state, n = self.state, rows.shape[0] // group
        first = slice(None) if every_row else rows[::group]  # [n] each run's row
        v0, q = self._view_start, tokens.shape[1]
        a = v0 - vq.start  # query columns left of the tokens (a logit shift's one)
        if v0 == vq.start and q == vq.length:  # the tokens are the query's columns: no canvas copy
            ids = tokens.reshape(n, -1)  # [n, g*Q]
        elif every_row and 0 < a and v0 + q >= vq.end:  # the query is a canvas prefix, then the tokens
            ids, tail = self.views.memo(("stacked ids", vq.start, vq.end, v0, group),
                                        lambda: self._stacked_ids(vq, v0, group))
            tail.copy_(tokens.view(n, group, q)[:, :, :vq.length - a])  # [n, g, Q - a]
        else:
            x = state.x[rows].clone()  # [N, L]
            x[:, v0:v0 + q] = tokens
            ids = x[:, cols].reshape(n, -1)
        if every_row:  # the block's steps forward the same rows at the same columns: made once per block
            positions = self.views.memo(("stacked positions", vq.start, vq.end, group),
                                        lambda: state.positions[:, cols].repeat(1, group))  # [n, g*Q]
        else:
            positions = state.positions[first][:, cols].repeat(1, group)
        kpm = state.key_padding_mask[first] if state.padded else None
        logits = None
        if self.graphs is not None and every_row:  # captured once per shape, replayed (dllm.engine.graphs)
            logits = self.graphs.variants(ids, positions, kpm, rows, group, vq.start, vq.key_end, head)
        if logits is None:
            if every_row:  # the same rows and columns at every step of the block: one view, which keeps the
                # RoPE rows (and a block-causal mask) made from the block's positions
                view = self.views.memo(("stacked view", vq.start, vq.key_end, group, n),
                                       lambda: state.kv.rows_view(rows, vq.start, vq.key_end, None, group,
                                                                  every_row=True, stacked=True, reuse=True))
            else:
                view = state.kv.rows_view(rows, vq.start, vq.key_end, None, group, every_row=False, stacked=True)
            if isinstance(self.model, DiffusionLM):  # the model itself: no module call
                logits = self.model.cached_logits(ids, positions, kpm, view, head)
            else:
                logits = self.model(ids, positions=positions, key_padding_mask=kpm, logits_rows=head, cache=view).logits
        return logits.view(rows.shape[0], -1, logits.shape[-1])  # [N, W, V]

    def _stacked_ids(self, vq: Query, v0: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ids of a block's stacked variant forwards whose query starts ``a = v0 - vq.start`` columns
        left of the variants' tokens (Dream's and Fast-dLLM v2's logit shift): a buffer [B, g, Q] whose
        first ``a`` columns are the canvas' (fixed while the block decodes: steps write their block
        only), made once per block. Returns (ids [B, g*Q], the buffer's token columns [B, g, Q - a]),
        views of one buffer that each step's variants overwrite in place."""
        a = v0 - vq.start
        left = self.state.x[:, vq.start:v0]  # [B, a]
        buf = left[:, None, :].expand(-1, group, -1)
        buf = torch.cat([buf, buf.new_empty((*buf.shape[:2], vq.length - a))], dim=2)  # [B, g, Q]
        return buf.view(buf.shape[0], -1), buf[:, :, a:]

    def _count(self, forwarded: int) -> None:
        self.state.nfe += 1
        self.state.forwarded_tokens += forwarded


def with_unconditional(x: torch.Tensor, prompt_mask: torch.Tensor, mask_id: int, positions: torch.Tensor,
                       kpm: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """LLaDA's guidance batch: the rows x [B, Q] (positions [B, Q], key padding mask [B, L] or None)
    followed by their unconditional copies, whose prompt columns (``prompt_mask`` [B, Q]) are the mask
    id -> [2B, Q], [2B, Q], [2B, L] or None (``guided`` combines their logits)."""
    x = torch.cat([x, x.masked_fill(prompt_mask, mask_id)])
    return x, positions.repeat(2, 1), None if kpm is None else kpm.repeat(2, 1)


def guided(logits: torch.Tensor, cfg_scale: float) -> torch.Tensor:
    """LLaDA's classifier-free guidance: [2B, ...] (conditional rows, then unconditional) -> [B, ...]."""
    cond, un = logits.chunk(2, dim=0)
    return un + (cfg_scale + 1) * (cond - un)


__all__ = ["StepForwards", "guided", "with_unconditional"]
