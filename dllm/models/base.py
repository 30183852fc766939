"""The interface every model in dllm implements: ``DiffusionLM`` (its inputs and ``ModelOutput``:
``dllm.models.inputs``).

Contract of ``forward``: ``logits[:, i]`` predicts the token AT position i, for every family (Dream's
one-position shift happens inside its wrapper). Batches are left-padded; ``positions`` and
``key_padding_mask`` make a padded row compute exactly what the prompt alone computes.

Subclasses provide ``_raw_forward`` (the unshifted logits as the official model returns them) and,
when they have a checkpoint format, ``save_pretrained``. ``TransformerLM`` (``families/pretrained.py``) is
the weight-backed implementation shared by LLaDA and Dream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Optional, Union

import torch
import torch.nn as nn

from dllm.models.core.config import TransformerConfig
from dllm.models.core.layer.fused import watched
from dllm.models.core.views import CacheView, StackedView
from dllm.models.core.packed_rows import packed_rows_logits
from dllm.models.core.soft_inputs import SoftInputs, applied_to
from dllm.models.inputs import ModelOutput, SpecialIds, default_positions, padding_attn_mask
from dllm.models.text.prompting import PromptsMixin


class DiffusionLM(PromptsMixin, nn.Module):
    """A masked diffusion language model: ids [B, T] -> logits [B, T, V] predicting every position."""

    family: ClassVar[str] = ""
    default_chat_template: ClassVar[Optional[str]] = None  # Jinja, used when the tokenizer has none

    def __init__(
        self,
        config: TransformerConfig,
        special: SpecialIds,
        *,
        hf_config: Optional[dict[str, Any]] = None,
        tokenizer: Any = None,
    ) -> None:
        super().__init__()
        special.check(config.vocab_size)
        self.config = config
        self.special = special
        self.hf_config: dict[str, Any] = dict(hf_config or {})
        self.tokenizer = tokenizer
        self.name_or_path = ""  # what ``dllm.load`` was given (for messages); "" when built in code

    # ---- special ids -------------------------------------------------------------------------
    @property
    def mask_id(self) -> int:
        return self.special.mask_id

    @property
    def eos_id(self) -> int:
        return self.special.eos_id

    @property
    def pad_id(self) -> int:
        return self.special.pad_id

    @property
    def eot_id(self) -> Optional[int]:
        return self.special.eot_id

    @property
    def bos_id(self) -> Optional[int]:
        return self.special.bos_id

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Ids that end an answer: eos, then eot when it exists and differs."""
        ids = [self.special.eos_id]
        if self.special.eot_id is not None and self.special.eot_id != self.special.eos_id:
            ids.append(self.special.eot_id)
        return tuple(ids)

    # ---- sizes, placement ----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int:
        return self.config.max_positions

    @property
    def dtype(self) -> torch.dtype:
        p = next(self.parameters(), None)
        return torch.float32 if p is None else p.dtype

    @property
    def device(self) -> torch.device:
        p = next(self.parameters(), None)
        return torch.device("cpu") if p is None else p.device

    @property
    def attn_backend(self) -> str:
        return "none"

    # ---- forward ---------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        positions: Optional[torch.Tensor] = None,
        key_padding_mask: Optional[torch.Tensor] = None,
        cache: Any = None,
        want_attn_layers: tuple[int, ...] = (),
        want_hidden_layers: tuple[int, ...] = (),
        logits_rows: Optional[tuple[int, int]] = None,
        soft_inputs: Optional[SoftInputs] = None,
        padded: Optional[bool] = None,
    ) -> ModelOutput:
        """input_ids [B, T] int; positions [B, T] int >= 0 (default: from the padding mask, else arange;
        not checked, which would read them back);
        key_padding_mask bool [B, T] (True = real token). Returns ModelOutput with logits [B, T, V]
        where logits[:, i] predicts the token at position i.

        With ``cache`` (a ``dllm.models.core.kv.CacheView`` over buffers from ``new_kv_cache``), the T rows
        are canvas columns ``[cache.start, cache.start + T)`` and attend to the cached keys
        ``[0, cache.key_end)`` (their own fresh K/V written in first); ``key_padding_mask`` is then
        canvas-wide, [B, L], and ``positions`` defaults to the rows' canvas positions. Logits still
        predict the query rows themselves, so for a shifted family (``logit_shift = 1``, Dream) the
        first row predicts nothing useful: start the query one column before the first position
        whose logits you need.

        ``logits_rows=(a, b)``: return only ``logits[:, a:b]`` ([B, b - a, V], same values). Models
        with ``supports_head_rows`` run the final norm and the LM head on those rows alone (for a
        step that reads a 32-column block of a 1,056-column canvas, the head's [B, L, V] becomes
        [B, 32, V]); others compute every row and slice. A shifted family needs ``a >= 1``.

        ``soft_inputs`` (``dllm.models.core.soft_inputs.SoftInputs``, rows in input coordinates): at its
        ``where`` positions the input is a mixture of token embeddings instead of ``input_ids``' own.

        ``padded=True``: the caller knows ``key_padding_mask`` holds padding, so it is not read back to
        look (without a cache an all-real mask otherwise takes the unmasked path, one host sync).
        """
        head_rows = None if logits_rows is None else self._head_rows(logits_rows, input_ids.shape[-1])
        if soft_inputs is not None:
            with applied_to(self._soft_embedding(soft_inputs), soft_inputs):
                return self._forward(input_ids, positions, key_padding_mask, cache, tuple(want_attn_layers),
                                     tuple(want_hidden_layers), head_rows, True, padded)
        return self._forward(input_ids, positions, key_padding_mask, cache, tuple(want_attn_layers),
                             tuple(want_hidden_layers), head_rows, False, padded)

    def _forward(self, input_ids: torch.Tensor, positions: Optional[torch.Tensor],
                 key_padding_mask: Optional[torch.Tensor], cache: Any, want_attn_layers: tuple[int, ...],
                 want_hidden_layers: tuple[int, ...], head_rows: Optional[tuple[int, int]], soft: bool,
                 padded: Optional[bool]) -> ModelOutput:
        """``forward`` once its soft inputs, if any, are applied to the embedding."""
        if cache is not None:
            return self._cached_forward(input_ids, positions, key_padding_mask, cache, want_attn_layers,
                                        want_hidden_layers, head_rows)
        positions, attn_mask = self._prepare(input_ids, positions, key_padding_mask, padded=padded)
        if self.packs_padded_rows and attn_mask is not None and not soft and not want_attn_layers and not want_hidden_layers:
            logits = packed_rows_logits(self, input_ids, positions, attn_mask, head_rows)
            if logits is not None:  # a long ragged batch, run per group of rows with the same real columns
                return ModelOutput(logits, {}, {})
        raw, hidden, attn = self._raw_forward(input_ids, positions, attn_mask, want_attn_layers, want_hidden_layers,
                                              **self._head_kwargs(head_rows))
        return ModelOutput(self._final_logits(raw, head_rows), hidden, attn)

    def input_embedding(self) -> Optional[nn.Module]:
        """The module that embeds input ids (soft inputs hook it); None when the model has none."""
        return getattr(getattr(self, "transformer", None), "embed", None)

    def _soft_embedding(self, soft_inputs: Optional[SoftInputs]) -> Optional[nn.Module]:
        if soft_inputs is None:
            return None
        embed = self.input_embedding()
        if embed is None:
            raise NotImplementedError(f"{self.display_name} has no input embedding, so it cannot take soft "
                                      "inputs (mixed token embeddings); use a weight-backed model")
        return embed

    supports_head_rows: ClassVar[bool] = False  # True when _raw_forward takes head_rows=(a, b)
    # a long padded batch without a cache runs per group of rows with the same real columns
    # (dllm.models.core.packed_rows); set False on an instance for the padded forward (the reference)
    packs_padded_rows: bool = False

    def _head_rows(self, logits_rows: tuple[int, int], t: int) -> tuple[int, int]:
        """``logits_rows`` (shifted, "predicts position i" rows) -> the raw rows that hold them."""
        a, b = (int(v) for v in logits_rows)
        shift = self.logit_shift
        if not shift <= a < b <= t:
            raise ValueError(f"logits_rows={logits_rows!r} must satisfy {shift} <= a < b <= {t} (the query "
                             f"length{'; a shifted family has no logits for row 0' if shift else ''})")
        return a - shift, b - shift

    def _head_kwargs(self, head_rows: Optional[tuple[int, int]]) -> dict[str, Any]:
        return {"head_rows": head_rows} if head_rows is not None and self.supports_head_rows else {}

    def _final_logits(self, raw: torch.Tensor, head_rows: Optional[tuple[int, int]]) -> torch.Tensor:
        """Official logits -> "predicts position i" logits: all rows shifted, or the asked rows
        (already aligned: raw row i - shift predicts position i)."""
        if head_rows is None:
            return self.shift_logits(raw)
        if self.supports_head_rows:
            return raw  # [B, b - a, V], computed for those rows only
        return raw[:, head_rows[0]:head_rows[1]]

    # ---- KV cache ------------------------------------------------------------------------------------
    supports_kv_cache: ClassVar[bool] = False  # True when _raw_forward accepts cache=CacheView

    def new_kv_cache(self, rows: int, length: int) -> Any:
        """Preallocated K/V buffers for ``rows`` x ``length`` canvas columns (``dllm.models.core.kv.KVCache``)."""
        raise NotImplementedError(
            f"{type(self).__name__} has no KV cache (no attention layers to cache); use cache='none'"
        )

    def _cached_forward(
        self,
        input_ids: torch.Tensor,
        positions: Optional[torch.Tensor],
        key_padding_mask: Optional[torch.Tensor],
        cache: Any,
        want_attn_layers: tuple[int, ...],
        want_hidden_layers: tuple[int, ...],
        head_rows: Optional[tuple[int, int]] = None,
    ) -> ModelOutput:
        positions = self._check_cached_inputs(input_ids, positions, key_padding_mask, cache)
        return self._cached_call(input_ids, positions, key_padding_mask, cache, want_attn_layers, want_hidden_layers,
                                 head_rows)

    def _cached_call(self, input_ids: torch.Tensor, positions: torch.Tensor, key_padding_mask: Optional[torch.Tensor],
                     cache: Any, want_attn_layers: tuple[int, ...], want_hidden_layers: tuple[int, ...],
                     head_rows: Optional[tuple[int, int]]) -> ModelOutput:
        """A cached forward of checked inputs (``_cached_forward``, ``cached_logits``)."""
        attn_mask = cache.attn_mask(key_padding_mask, input_ids.shape[1])  # [B, 1, 1, K] or None
        raw, hidden, attn = self._raw_forward(input_ids, positions, attn_mask, want_attn_layers,
                                              want_hidden_layers, cache=cache, **self._head_kwargs(head_rows))
        return ModelOutput(self._final_logits(raw, head_rows), hidden, attn)

    def cached_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, key_padding_mask: Optional[torch.Tensor],
                      cache: Any, logits_rows: Optional[tuple[int, int]] = None) -> torch.Tensor:
        """``self(input_ids, positions=positions, key_padding_mask=key_padding_mask, cache=cache,
        logits_rows=logits_rows).logits`` for a cached forward whose inputs the caller built valid (the
        engine's steps: a ``CacheView`` of its own buffers, the positions of the query's columns),
        without the module call and the input checks: the same logits (tests/models/test_cached_logits.py),
        less host time per step. Where something runs around this module's forward (a hook, which must
        see the call, or a compiled call: ``dllm.models.core.layer.fused.watched``) the module is called."""
        if watched(self):
            return self(input_ids, positions=positions, key_padding_mask=key_padding_mask, cache=cache,
                        logits_rows=logits_rows).logits
        head_rows = None if logits_rows is None else self._head_rows(logits_rows, input_ids.shape[-1])
        return self._cached_call(input_ids, positions, key_padding_mask, cache, (), (), head_rows).logits

    def _check_cached_inputs(
        self,
        input_ids: torch.Tensor,
        positions: Optional[torch.Tensor],
        key_padding_mask: Optional[torch.Tensor],
        cache: Any,
    ) -> torch.Tensor:
        """Validate a cached forward's inputs (see ``forward``); returns the positions [B, T]
        (default: the query rows' canvas positions)."""
        if not isinstance(cache, CacheView) or not self.supports_kv_cache:
            raise NotImplementedError(
                f"cache={type(cache).__name__} is not supported by {type(self).__name__}: forward takes "
                "a dllm.models.core.kv.CacheView, and only models with attention layers (supports_kv_cache) "
                "can use one; pass cache=None"
            )
        if input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
            raise ValueError(f"input_ids must be an integer tensor [B, T], got {input_ids.dtype} "
                             f"{list(input_ids.shape)}")
        rows, t = input_ids.shape
        length = cache.kv.length
        cache.check_queries(t)
        if rows != cache.rows:
            raise ValueError(f"input_ids has {rows} rows but the KV cache view was allocated for {cache.rows}")
        if key_padding_mask is not None and (key_padding_mask.shape != (rows, length)
                                             or key_padding_mask.dtype != torch.bool):
            raise ValueError(f"with a cache, key_padding_mask must be bool [{rows}, {length}] (the whole "
                             f"canvas), got {key_padding_mask.dtype} {list(key_padding_mask.shape)}")
        if positions is None:
            if isinstance(cache, StackedView):  # g variants of T columns: the canvas columns are not theirs
                raise ValueError("a stacked view's forward needs positions [B, g*T] (each variant's T "
                                 "columns' positions, g times over), got None")
            full = torch.empty((rows, length), dtype=torch.long, device=input_ids.device)
            return default_positions(full, key_padding_mask)[:, cache.columns(t, full.device)]
        if positions.shape != input_ids.shape or positions.dtype.is_floating_point:
            raise ValueError(f"positions must be an integer tensor {list(input_ids.shape)} like "
                             f"input_ids, got {positions.dtype} {list(positions.shape)}")
        return positions

    def raw_logits(
        self,
        input_ids: torch.Tensor,
        positions: Optional[torch.Tensor] = None,
        key_padding_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Unshifted logits [B, T, V] exactly as the official model returns them."""
        positions, attn_mask = self._prepare(input_ids, positions, key_padding_mask)
        return self._raw_forward(input_ids, positions, attn_mask, (), ())[0]

    def shadow_forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        *,
        start: int,
        end: int,
        positions: Optional[torch.Tensor] = None,
        key_padding_mask: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, T, V] as ``forward``, leave-one-out logits [B, W, V]) for W = end - start:
        ``[:, k]`` predicts column ``start + k`` from a view in which that column's token is hidden.

        Reference path (``dllm.models.core.shadow``): one extra forward over W masked copies of each row.
        Transformers override it with WINO's shadow block (one forward of T + W rows).
        """
        from dllm.models.core import shadow

        shadow.check_span(input_ids.shape[1], start, end, self.logit_shift)
        logits = self(input_ids, positions=positions, key_padding_mask=key_padding_mask).logits
        w = end - start
        copies = shadow.masked_copies(input_ids, start, end, self.mask_id)  # [B * W, T]
        rep = (lambda t: None if t is None else t.repeat_interleave(w, dim=0))
        loo = self(copies, positions=rep(positions), key_padding_mask=rep(key_padding_mask)).logits
        return logits, shadow.diagonal(loo, input_ids.shape[0], start, end)

    logit_shift: ClassVar[int] = 0  # official logits at row i predict position i + logit_shift

    def shift_logits(self, raw: torch.Tensor) -> torch.Tensor:
        """Official logits [B, T, V] -> logits where [:, i] predicts position i (identity here)."""
        return raw

    def _raw_forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T]
        attn_mask: Optional[torch.Tensor],  # bool [B, 1, T|1, T] or None ([B, 1, T|1, K] with a cache)
        want_attn_layers: tuple[int, ...],
        want_hidden_layers: tuple[int, ...],
        cache: Any = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        raise NotImplementedError(f"{type(self).__name__} must implement _raw_forward")

    def _prepare(
        self,
        input_ids: torch.Tensor,
        positions: Optional[torch.Tensor],
        key_padding_mask: Optional[torch.Tensor],
        *,
        padded: Optional[bool] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Validate shapes; return (positions [B, T], attention mask [B, 1, 1, T] or None)."""
        if input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
            raise ValueError(f"input_ids must be an integer tensor [B, T], got {input_ids.dtype} "
                             f"{list(input_ids.shape)}")
        if key_padding_mask is not None:
            if key_padding_mask.shape != input_ids.shape or key_padding_mask.dtype != torch.bool:
                raise ValueError(f"key_padding_mask must be bool {list(input_ids.shape)} like "
                                 f"input_ids, got {key_padding_mask.dtype} {list(key_padding_mask.shape)}")
        if positions is None:
            positions = default_positions(input_ids, key_padding_mask)
        elif positions.shape != input_ids.shape or positions.dtype.is_floating_point:
            raise ValueError(f"positions must be an integer tensor {list(input_ids.shape)} like "
                             f"input_ids, got {positions.dtype} {list(positions.shape)}")
        # One host sync: an all-real mask takes the unmasked fast path. Callers that know there is
        # no padding pass key_padding_mask=None, and those that know there is pass padded=True.
        if key_padding_mask is None or (padded is not True and bool(key_padding_mask.all())):
            return positions, None
        return positions, padding_attn_mask(key_padding_mask)

    # ---- checkpoints -------------------------------------------------------------------------------
    def save_pretrained(self, path: Union[str, Path], max_shard_size: Optional[int] = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no checkpoint format to save")
