"""``TransformerLM``: a DiffusionLM backed by the shared transformer and an official checkpoint format.

A family (``llada.py``, ``dream.py``) subclasses it and supplies: its ``model_types``, a ``KeyMap``,
the config translation ``from_hf_config`` / ``to_hf_config``, the default special ids and chat
template, and (Dream) the logit shift.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Mapping, Optional, Union

import torch

from dllm.models.base import DiffusionLM
from dllm.models.inputs import SpecialIds
from dllm.models.checkpoint import (CheckpointError, CheckpointReader, Shape, check_keys, check_shard_size,
                                    nonfinite_counts, write_safetensors)
from dllm.models.core.config import TransformerConfig
from dllm.models.core.layer.fused import call_module
from dllm.models.families.keymap import KeyMap
from dllm.models.text.tokenizer import save_tokenizer, token_id
from dllm.models.core.transformer import Transformer

GENERATION_CONFIG = "generation_config.json"

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
}


def require_fields(hf: Mapping[str, Any], names: tuple[str, ...], family: str) -> None:
    """ValueError naming every required config.json field that is absent (or null)."""
    missing = [n for n in names if hf.get(n) is None]
    if missing:
        raise ValueError(f"{family} config.json is missing required field(s): {', '.join(missing)} "
                         "(dllm never falls back to code defaults for these)")


def number_field(hf: Mapping[str, Any], name: str, family: str, default: Optional[float] = None) -> float:
    """config.json field ``name`` (``default`` when absent) as a float: a JSON number, not a string, a
    boolean or null; ValueError naming the family's file, the field and the value otherwise (``float("x")``
    alone names neither, and ``float(True)`` is silently 1.0)."""
    value = hf.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{family} config.json field {name} = {value!r} is not a number; it must be a JSON "
                         f"number such as 1000000.0, 1e-06 or 0.5, not a string, a boolean or null")
    return float(value)


def int_field(hf: Mapping[str, Any], name: str, family: str, default: Optional[int] = None) -> int:
    """config.json field ``name`` (``default`` when absent) as an int: a JSON integer, not a string, a
    boolean, a fraction or null; ValueError naming the family's file, the field and the value otherwise
    (``int(True)`` is silently 1, ``int(4.5)`` silently 4)."""
    value = hf.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{family} config.json field {name} = {value!r} is not an integer; it must be a JSON "
                         f"integer such as 32, not a string, a boolean, a fraction or null")
    return value


def resolve_special(
    hf: Mapping[str, Any],
    tokenizer: Any,
    *,
    defaults: SpecialIds,
    tokens: Mapping[str, str],
    vocab_rows: int,
    family: str,
) -> SpecialIds:
    """Special ids: the config.json field first, then the tokenizer, then the family default.

    tokens: id name -> token string to look up in the tokenizer's vocabulary (e.g. eot_id ->
    "<|eot_id|>"). Optional ids (eot, bos) fall back to the default only when it fits the vocabulary.
    """
    config_field = {"mask_id": "mask_token_id", "eos_id": "eos_token_id", "pad_id": "pad_token_id",
                    "bos_id": "bos_token_id", "eot_id": "eot_token_id"}
    tok_attr = {"mask_id": "mask_token_id", "eos_id": "eos_token_id", "pad_id": "pad_token_id",
                "bos_id": "bos_token_id"}
    out: dict[str, Optional[int]] = {}
    for name, field_name in config_field.items():
        value = hf.get(field_name)
        if isinstance(value, list):  # some configs list several eos ids; the first is the EOS
            value = value[0] if value else None
        if value is None and tokenizer is not None:
            value = token_id(tokenizer, tokens[name]) if name in tokens else None
            if value is None and name in tok_attr:
                value = getattr(tokenizer, tok_attr[name], None)
        if value is None and name == "pad_id":
            value = out.get("eos_id")
        if value is None:
            value = getattr(defaults, name)
            optional = name in ("eot_id", "bos_id")
            if value is not None and not 0 <= value < vocab_rows:
                if optional:
                    value = None
                else:
                    raise ValueError(
                        f"{family}: {name} comes from the family default {value}, which is outside the "
                        f"vocabulary ({vocab_rows} rows); set {field_name!r} in config.json or ship "
                        "a tokenizer that defines it"
                    )
        out[name] = value
    return SpecialIds(**out)  # type: ignore[arg-type]


class TransformerLM(DiffusionLM):
    """The shared transformer plus the checkpoint plumbing every weight-backed family shares."""

    model_types: ClassVar[tuple[str, ...]] = ()  # config.json "model_type" values of the family
    keymap: ClassVar[KeyMap]
    default_special: ClassVar[SpecialIds]

    def __init__(
        self,
        config: TransformerConfig,
        special: SpecialIds,
        *,
        hf_config: Optional[dict[str, Any]] = None,
        tokenizer: Any = None,
        attn_backend: str = "auto",
    ) -> None:
        config = self.family_config(config)
        self.check_config(config)
        super().__init__(config, special, hf_config=hf_config, tokenizer=tokenizer)
        self.transformer = Transformer(config, attn_backend)
        if not self.hf_config:
            self.hf_config = self.to_hf_config(config, special, torch.get_default_dtype())
        self.hf_generation_config: dict[str, Any] = {}  # a loaded generation_config.json, kept on save
        self.sharding: Any = None  # dllm.models.parallel.TensorParallel when loaded with tensor_parallel=N

    # ---- family hooks ----------------------------------------------------------------------------
    @classmethod
    def family_config(cls, config: TransformerConfig) -> TransformerConfig:
        """``config`` with the switches the family's official code fixes (what its format does not
        store); unchanged by default."""
        return config

    @classmethod
    def check_config(cls, config: TransformerConfig) -> None:
        """ValueError when the family's checkpoint format cannot express ``config``."""

    @classmethod
    def from_hf_config(
        cls, hf: Mapping[str, Any], tokenizer: Any = None
    ) -> tuple[TransformerConfig, SpecialIds]:
        raise NotImplementedError

    @classmethod
    def to_hf_config(
        cls, config: TransformerConfig, special: SpecialIds, dtype: torch.dtype
    ) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def to_hf_generation_config(cls, special: SpecialIds) -> dict[str, Any]:
        """generation_config.json content. Here: what transformers' ``from_pretrained`` builds from
        config.json when the file is absent (``GenerationConfig.from_model_config``), so writing it
        changes nothing for a loader that tolerates its absence (LLaDA's). ``transformers_version``
        is left out: it records the writer's transformers, and dllm writes without it."""
        return {"_from_model_config": True, "eos_token_id": special.eos_id, "pad_token_id": special.pad_id}

    # ---- attention backend -----------------------------------------------------------------------
    @property
    def block_size(self) -> Optional[int]:
        """The block a block-causal checkpoint was trained with (config.json ``block_size`` for SDAR,
        ``bd_size`` for Fast-dLLM v2); None for a bidirectional model."""
        return self.config.block_size if self.config.block_causal else None

    @property
    def attn_backend(self) -> str:
        """Name of the resolved attention backend ("sdpa", "reference", ...)."""
        return self.transformer.attn_backend

    def set_attn_backend(self, name: str) -> str:
        """Switch the attention backend ("auto" resolves again); returns the resolved name."""
        return self.transformer.set_attn_backend(name)

    # ---- forward ---------------------------------------------------------------------------------
    def _raw_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_mask: Optional[torch.Tensor],
        want_attn_layers: tuple[int, ...],
        want_hidden_layers: tuple[int, ...],
        cache: Any = None,
        head_rows: Optional[tuple[int, int]] = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        return call_module(self.transformer, input_ids, positions, attn_mask, want_attn_layers, want_hidden_layers,
                           cache, head_rows)

    def shadow_forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        *,
        start: int,
        end: int,
        positions: Optional[torch.Tensor] = None,
        key_padding_mask: Optional[torch.Tensor] = None,
        cache: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """WINO's shadow block: one forward of [B, T + W] rows (``dllm.models.core.shadow``); the first
        T rows equal ``forward``'s logits, the last W are the leave-one-out predictions.

        With ``cache`` (a ``CacheView``) the T rows are canvas columns ``[cache.start, cache.start +
        T)`` as in ``forward`` (``key_padding_mask`` canvas-wide [B, L], ``positions`` [B, T] required)
        and ``[start, end)`` are canvas columns inside them; the shadow rows read the cached keys
        (``ShadowCacheView``)."""
        from dllm.models.core import shadow

        b, t = input_ids.shape
        shift = self.logit_shift
        if cache is None:
            q0, length, key_end, view = 0, t, None, None
            shadow.check_span(t, start, end, shift)
            positions, _ = self._prepare(input_ids, positions, key_padding_mask)
        else:
            if positions is None:
                raise ValueError(f"a cached shadow forward needs positions {list(input_ids.shape)} (the "
                                 "query columns' canvas positions), got None")
            positions = self._check_cached_inputs(input_ids, positions, key_padding_mask, cache)
            q0, length, key_end = cache.start, cache.kv.length, cache.key_end
            shadow.check_span(length, start, end, shift)
            if not (q0 <= start - shift and end <= q0 + t):
                raise ValueError(f"shadow span [{start}, {end}) (logit shift {shift}) is not inside the "
                                 f"query columns [{q0}, {q0 + t})")
            view = shadow.ShadowCacheView(cache.kv, q0, key_end, n_real=t)
        ids = torch.cat([input_ids, input_ids.new_full((b, end - start), self.mask_id)], dim=1)  # [B, T+W]
        pos = shadow.shadow_positions(positions, start - q0, end - q0, shift)  # [B, T + W]
        # a cached unpadded forward's mask is the same at every step of the block: made once, read-only
        kept = cache.kv.shadow_masks if view is not None and key_padding_mask is None else None
        key = (b, length, start, end, t, key_end)
        mask = None if kept is None else kept.get(key)
        if mask is None:
            mask = shadow.shadow_attn_mask(key_padding_mask, b, length, start, end, input_ids.device,
                                           n_queries=t, key_end=key_end)  # [B, 1, T+W, K+W]
            if kept is not None:
                kept[key] = mask
        raw, _, _ = self._raw_forward(ids, pos, mask, (), (), cache=view)  # [B, T + W, V]
        return self.shift_logits(raw[:, :t]), raw[:, t:]  # shadow rows predict their targets unshifted

    # ---- KV cache ----------------------------------------------------------------------------------
    supports_kv_cache: ClassVar[bool] = True
    supports_head_rows: ClassVar[bool] = True
    packs_padded_rows: bool = True

    def new_kv_cache(self, rows: int, length: int) -> Any:
        """K/V buffers [rows, Hkv, length, hd] per layer, on the layer's device (``dllm.cache``)."""
        return self.transformer.new_kv_cache(rows, length)

    # ---- official state dict ---------------------------------------------------------------------
    def official_shapes(self) -> dict[str, Shape]:
        """Official key -> shape of every tensor the checkpoint must hold (works on the meta device)."""
        return {self.keymap.to_official(k): tuple(v.shape) for k, v in self.transformer.state_dict().items()}

    def official_state_dict(self) -> dict[str, torch.Tensor]:
        """Official key -> tensor (the model's own tensors, not copies)."""
        return {self.keymap.to_official(k): v for k, v in self.transformer.state_dict().items()}

    def load_official(
        self,
        reader: CheckpointReader,
        *,
        dtype: torch.dtype,
        device: Union[str, torch.device, None] = None,
    ) -> None:
        """Check every key and shape first (one error listing all problems), then assign the
        checkpoint's tensors (converted to ``dtype`` on ``device``) as this model's parameters.
        A tensor with NaN or inf values (stored, or from overflow in the conversion) is refused:
        one CheckpointError names every such tensor, instead of a model that decodes nothing."""
        found = {k: s for k, s in reader.shapes.items() if not self.keymap.is_ignored(k)}
        check_keys(self.official_shapes(), found, repr(str(reader.directory)))
        state: dict[str, torch.Tensor] = {}
        bad: list[str] = []
        for key in found:
            internal = self.keymap.to_internal(key)
            assert internal is not None  # check_keys reported every unknown key
            stored = reader.get(key)
            tensor = stored.to(device=device or "cpu", dtype=dtype)
            counts = nonfinite_counts(tensor)
            if counts is not None:
                why = "" if nonfinite_counts(stored) else f" (stored values are finite: they overflow {dtype})"
                bad.append(f"  {key}: {counts[0]} NaN, {counts[1]} inf of {stored.numel()} values{why}")
            self.place(state, internal, tensor)
        if bad:
            raise CheckpointError(f"checkpoint {str(reader.directory)!r} has non-finite weights in "
                                  f"{len(bad)} tensor(s):\n" + "\n".join(bad))
        self.assign(state)

    def place(self, state: dict[str, torch.Tensor], internal: str, tensor: torch.Tensor) -> None:
        """Keep a loaded tensor (internal name) in ``state``: all of it, or with ``sharding`` this
        process's part (a slice, or nothing for another rank's expert), so no process holds the
        whole model while loading."""
        part = tensor if self.sharding is None else self.sharding.local(internal, tensor)
        if part is not None:
            state[internal] = part

    def assign(self, state: dict[str, torch.Tensor]) -> None:
        """The loaded tensors become the parameters (with ``sharding``: of the local-width modules
        it builds first)."""
        if self.sharding is not None:
            self.sharding.shard_modules(self)
        self.transformer.load_state_dict(state, strict=True, assign=True)

    # ---- saving ----------------------------------------------------------------------------------
    def official_config(self) -> dict[str, Any]:
        """config.json content: the loaded official config overlaid with this model's values."""
        # "dtype" is the name transformers 4.57+ writes; the official files say "torch_dtype"
        out = {k: v for k, v in self.hf_config.items() if k != "dtype"}
        out.update(self.to_hf_config(self.config, self.special, self.dtype))
        return out

    def check_round_trip(self, config: Mapping[str, Any]) -> None:
        """ValueError when ``config`` (this model's config.json) would load back as another model: a
        setting the family's format does not store (a block-causal LLaDA, a partial rotary width, ...)."""
        back = self.family_config(self.from_hf_config(config, self.tokenizer)[0])

        def effective(c: TransformerConfig, f: str) -> Any:  # None spelled out: the width it stands for
            if f == "attn_head_dim":
                return c.head_dim
            return (c.rope_dim or c.head_dim) if f == "rope_dim" else getattr(c, f)

        lost = {f: (getattr(self.config, f), getattr(back, f)) for f in self.config.field_names()
                if effective(self.config, f) != effective(back, f)}
        if lost:
            said = ", ".join(f"{f}={mine!r} (would load as {theirs!r})" for f, (mine, theirs) in sorted(lost.items()))
            raise ValueError(f"{type(self).__name__}'s checkpoint format (config.json) cannot express {said}; "
                             f"nothing was written")

    def official_generation_config(self) -> dict[str, Any]:
        """generation_config.json content: the family's fields, overlaid with a loaded file's, with
        this model's token ids (they must agree with config.json)."""
        family = self.to_hf_generation_config(self.special)
        ids = {k: v for k, v in family.items() if k.endswith("_token_id")}
        return {**family, **self.hf_generation_config, **ids}

    def refuse_split_save(self) -> None:
        """ValueError for a model loaded with ``tensor_parallel=N`` (N > 1): each rank holds a slice of
        the split tensors (``dllm.models.parallel.shard``), which config.json's sizes do not describe."""
        n = 1 if self.sharding is None else self.sharding.plan.size
        if n > 1:
            raise ValueError(f"cannot save a model split over tensor_parallel={n} ranks: rank "
                             f"{self.sharding.plan.rank} holds only its slices of the split tensors, not the sizes "
                             "config.json describes; load it without tensor_parallel to save it")

    def save_pretrained(self, path: Union[str, Path], max_shard_size: Optional[int] = None) -> None:
        """Write the official layout: config.json, generation_config.json (the official Dream loader
        refuses a directory without one), model.safetensors (or shards + index when
        ``max_shard_size`` bytes is given and exceeded), and the tokenizer files when present. Refused,
        before anything is written: a quantized model, one split over tensor-parallel ranks, a bad
        ``max_shard_size``."""
        from dllm.models.quantize import refuse_quantized_save

        refuse_quantized_save(self)
        self.refuse_split_save()
        check_shard_size(max_shard_size)
        config = self.official_config()
        self.check_round_trip(config)
        state = self.official_state_dict()  # before any file is written: a failure leaves the directory as it was
        generation = json.dumps(self.official_generation_config(), indent=2, sort_keys=True)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (path / GENERATION_CONFIG).write_text(generation + "\n")
        write_safetensors(state, path, max_shard_size)
        if self.tokenizer is not None:
            save_tokenizer(self.tokenizer, path)
