"""LLaDA 2.x MoE (inclusionAI/LLaDA2.0-mini, -flash): config.json translation, checkpoint key names,
the MoE feed-forward, block-causal attention.

The network is the shared transformer (``core/transformer.py``) with the switches LLaDA 2 needs: block-
causal attention (``attention = "block_causal"``; trained and decoded in blocks of 32), per-head
RMSNorm of q and k before RoPE (``qk_norm``; ``use_qk_norm``, absent = true as dFactory), partial rotary (``rope_dim = head_dim *
partial_rotary_factor``, cos/sin in the activation dtype), an explicit ``head_dim``; its first
``first_k_dense_replace`` layers keep a dense SwiGLU and the others a ``dllm.models.core.layer.moe.SparseMoE``
(swapped in after the transformer is built). Logits are not shifted.

Checkpoint layouts: model_type ``llada2_moe`` (the Hugging Face release; the keys dFactory's
``scripts/moe_convertor.py`` splits back to) and ``llada2_moe_veomni`` (dFactory's training layout:
the experts of a layer stacked, ``mlp.experts.gate_proj`` [E, F, D] ...); a model is saved in the
layout it was loaded from. Keys: ``model.word_embeddings``, ``model.layers.N.
input_layernorm``, ``attention.query_key_value`` (q, k, v rows fused: split on load, fused on save),
``attention.query_layernorm`` / ``key_layernorm``, ``attention.dense``, ``post_attention_layernorm``,
``mlp.{gate,up,down}_proj`` (dense layers) or ``mlp.gate.weight`` + ``mlp.gate.expert_bias`` +
``mlp.experts.E.{gate,up,down}_proj`` + ``mlp.shared_experts.*``, ``model.norm``, ``lm_head``.
Sources: inclusionAI/dFactory ``models/llada2_moe/modeling_llada2_moe.py``,
``configuration_llada2_moe.py``, ``configs/model_configs/llada2_mini/config.json``; the LLaDA 2.0
tech report ("Scaling Up Diffusion Language Models to 100B", inclusionAI/LLaDA2.0 ``tech_report.pdf``).
Loaded without ``trust_remote_code``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Union

import torch

from dllm.models.inputs import SpecialIds
from dllm.models.checkpoint import CheckpointError, CheckpointReader, Shape, check_keys, nonfinite_counts
from dllm.models.core.config import TransformerConfig
from dllm.models.families.keymap import INTERNAL_LAYER_PREFIX, KeyMap
from dllm.models.core.layer.moe import MoEConfig, SparseMoE
from dllm.models.families.pretrained import (DTYPE_NAMES, TransformerLM, int_field, number_field, require_fields,
                                             resolve_special)

LLADA2_MODEL_TYPES = ("llada2_moe", "llada2_moe_veomni")
VEOMNI = "llada2_moe_veomni"  # dFactory's training layout: each layer's experts stacked in one tensor per projection
# a stacked expert tensor of the veomni layout: [E, F, D] (gate, up) or [E, D, F] (down)
_STACKED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_proj|up_proj|down_proj)$")
_PER_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
LLADA2_BLOCK = 32  # dFactory's block_size (configs/sft/*_bd_sft.yaml) and generate()'s block_length
QKV = "attention.query_key_value"  # the fused official projection: rows [q (H*hd); k (Hkv*hd); v (Hkv*hd)]


class LLaDA2KeyMap(KeyMap):
    """LLaDA 2's names; every ``mlp.*`` suffix (dense MLP, router, experts.E.*, shared experts) is
    the same on both sides, so the expert count needs no table."""

    def to_official(self, internal: str) -> str:
        m = self._internal_re.match(internal)
        if m is not None and m.group(2).startswith("mlp.") and not m.group(2).startswith("mlp_norm"):
            return self.layer_prefix.format(i=m.group(1)) + m.group(2)
        return super().to_official(internal)

    def to_internal(self, official: str) -> Optional[str]:
        m = self._official_re.match(official)
        if m is not None and m.group(2).startswith("mlp."):
            return INTERNAL_LAYER_PREFIX.format(i=m.group(1)) + m.group(2)
        return super().to_internal(official)


LLADA2_KEYMAP = LLaDA2KeyMap(
    global_names=(
        ("model.word_embeddings.weight", "embed.weight"),
        ("model.norm.weight", "norm.weight"),
        ("lm_head.weight", "lm_head.weight"),  # absent when tie_word_embeddings
    ),
    layer_prefix="model.layers.{i}.",
    layer_names=(
        ("input_layernorm.weight", "attn_norm.weight"),
        (QKV + ".weight", "attn.qkv.weight"),  # fused: LLaDA2.load_official / official_state_dict split it
        (QKV + ".bias", "attn.qkv.bias"),
        ("attention.query_layernorm.weight", "attn.q_norm.weight"),
        ("attention.key_layernorm.weight", "attn.k_norm.weight"),
        ("attention.dense.weight", "attn.o_proj.weight"),
        ("post_attention_layernorm.weight", "mlp_norm.weight"),
    ),
    ignored=(r"\.rotary_emb\.inv_freq$",),
)

_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "vocab_size", "rms_norm_eps", "rope_theta", "max_position_embeddings",
             "num_experts", "num_experts_per_tok", "moe_intermediate_size")

# field -> (its value when absent, is the value supported?, what is supported)
_SUPPORTED: dict[str, tuple[Any, Any, str]] = {
    "hidden_act": ("silu", lambda v: v == "silu", '"silu"'),
    "use_bias": (True, lambda v: not v, "false (attention.dense without bias)"),
    "norm_head": (False, lambda v: not v, "false"),
    "rope_scaling": (None, lambda v: v is None, "null"),
    "use_sliding_window": (False, lambda v: not v, "false"),
    "score_function": ("sigmoid", lambda v: v == "sigmoid", '"sigmoid"'),
    "moe_router_enable_expert_bias": (True, lambda v: v is True, "true"),
    "norm_topk_prob": (True, lambda v: v is True, "true (dFactory's gate always normalises top-k weights)"),
    "use_rmsnorm": (True, lambda v: v is True, "true"),
}


def moe_from_hf(hf: Mapping[str, Any]) -> MoEConfig:
    return MoEConfig(
        n_experts=hf["num_experts"], top_k=hf["num_experts_per_tok"], expert_hidden=hf["moe_intermediate_size"],
        n_shared=hf.get("num_shared_experts") or 0, n_group=hf.get("n_group") or 1,
        topk_group=hf.get("topk_group") or 1, routed_scaling=number_field(hf, "routed_scaling_factor", "LLaDA2", 1.0),
        score_fn=hf.get("score_function", "sigmoid"), first_dense=hf.get("first_k_dense_replace") or 0,
    )


def moe_to_hf(moe: MoEConfig) -> dict[str, Any]:
    return {
        "num_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.expert_hidden,
        "num_shared_experts": moe.n_shared or None, "n_group": moe.n_group, "topk_group": moe.topk_group,
        "routed_scaling_factor": moe.routed_scaling, "score_function": moe.score_fn,
        "first_k_dense_replace": moe.first_dense, "norm_topk_prob": True, "moe_router_enable_expert_bias": True,
        "router_dtype": "fp32",
    }


class LLaDA2(TransformerLM):
    """LLaDA 2.x MoE: the shared transformer (block-causal, qk-norm, partial RoPE) with MoE layers."""

    family = "llada2"
    model_types = LLADA2_MODEL_TYPES
    keymap = LLADA2_KEYMAP
    default_special = SpecialIds(mask_id=156895, eos_id=156892, pad_id=156892)

    def __init__(self, config: TransformerConfig, special: SpecialIds, *, moe: Optional[MoEConfig] = None,
                 hf_config: Optional[dict[str, Any]] = None, **kwargs: Any) -> None:
        if moe is None:
            if not hf_config:
                raise ValueError("LLaDA2 needs its MoE sizes: pass moe=MoEConfig(...) or an official hf_config")
            moe = moe_from_hf(hf_config)
        if moe.first_dense > config.n_layers:
            raise ValueError(f"first_k_dense_replace {moe.first_dense} exceeds num_hidden_layers {config.n_layers}")
        self.moe_config = moe
        self.stacked_experts = bool(hf_config) and hf_config.get("model_type") == VEOMNI
        if not hf_config:
            hf_config = {**self.to_hf_config(config, special, torch.get_default_dtype()), **moe_to_hf(moe)}
        super().__init__(config, special, hf_config=hf_config, **kwargs)
        for i, layer in enumerate(self.transformer.layers):
            if i >= moe.first_dense:  # the official LLaDA2MoeDecoderLayer: dense below first_k_dense_replace
                layer.mlp = SparseMoE(config.d_model, moe, layer=i)

    @classmethod
    def check_config(cls, config: TransformerConfig) -> None:
        if not config.block_causal:
            raise ValueError("LLaDA2 needs attention='block_causal'")

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any], tokenizer: Any = None) -> tuple[TransformerConfig, SpecialIds]:
        """Official config.json dict -> (TransformerConfig, SpecialIds); the MoE part is ``moe_from_hf``."""
        require_fields(hf, _REQUIRED, "LLaDA2")
        for name, (default, ok, valid) in _SUPPORTED.items():
            if not ok(hf.get(name, default)):
                raise NotImplementedError(f"LLaDA2 config.json field {name} = {hf.get(name, default)!r} is not "
                                          f"supported (supported: {valid})")
        heads = int_field(hf, "num_attention_heads", "LLaDA2")
        head_dim = (int_field(hf, "head_dim", "LLaDA2") if hf.get("head_dim")
                    else int_field(hf, "hidden_size", "LLaDA2") // heads)
        rope_dim = int(head_dim * number_field(hf, "partial_rotary_factor", "LLaDA2", 1.0))
        if hf.get("rotary_dim") is not None and hf["rotary_dim"] != rope_dim:
            raise ValueError(f"LLaDA2 config.json: rotary_dim {hf['rotary_dim']} disagrees with head_dim {head_dim} "
                             f"x partial_rotary_factor {hf.get('partial_rotary_factor', 1.0)} = {rope_dim}")
        moe_from_hf(hf)  # ValueError / NotImplementedError for MoE fields now, before any weight is read
        config = TransformerConfig(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=heads, n_kv_heads=hf["num_key_value_heads"] or heads, mlp_hidden=hf["intermediate_size"],
            rope_theta=number_field(hf, "rope_theta", "LLaDA2"), rms_eps=number_field(hf, "rms_norm_eps", "LLaDA2"),
            max_positions=hf["max_position_embeddings"], qkv_bias=bool(hf.get("use_qkv_bias", False)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_fp32=False,  # cos/sin cast to the activation dtype, rotation in that dtype
            # dFactory's attention always normalises q and k; the Hugging Face release's gates it on
            # use_qk_norm (true in the released configs)
            attn_head_dim=head_dim, qk_norm=bool(hf.get("use_qk_norm", True)), attention="block_causal",
            block_size=int_field(hf, "block_size", "LLaDA2") if hf.get("block_size") else LLADA2_BLOCK,
            rope_dim=rope_dim if rope_dim < head_dim else None,
        )
        special = resolve_special(hf, tokenizer, defaults=cls.default_special, vocab_rows=hf["vocab_size"],
                                  family="LLaDA2", tokens={"mask_id": "<|mask|>"})
        return config, special

    @classmethod
    def to_hf_config(cls, config: TransformerConfig, special: SpecialIds, dtype: torch.dtype) -> dict[str, Any]:
        """The non-MoE fields of the official config.json (``official_config`` adds the MoE ones)."""
        return {
            "model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"],
            "hidden_size": config.d_model, "intermediate_size": config.mlp_hidden,
            "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
            "num_key_value_heads": config.n_kv_heads, "head_dim": config.head_dim,
            "partial_rotary_factor": (config.rope_dim or config.head_dim) / config.head_dim,
            "rotary_dim": config.rope_dim or config.head_dim, "hidden_act": "silu",
            "use_qkv_bias": config.qkv_bias, "use_qk_norm": config.qk_norm, "use_bias": False, "use_rmsnorm": True, "norm_head": False,
            "rms_norm_eps": config.rms_eps, "rope_theta": config.rope_theta, "rope_scaling": None,
            "max_position_embeddings": config.max_positions, "vocab_size": config.vocab_size,
            "tie_word_embeddings": config.tie_embeddings, "use_sliding_window": False, "use_cache": False,
            "embedding_dropout": 0.0, "attention_dropout": 0.0, "output_dropout": 0.0,
            "block_size": config.block_size, "mask_token_id": special.mask_id,
            "eos_token_id": special.eos_id, "pad_token_id": special.pad_id,
            "torch_dtype": DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch.")),
        }

    def official_config(self) -> dict[str, Any]:
        out = {**super().official_config(), **moe_to_hf(self.moe_config)}
        return {**out, "model_type": VEOMNI} if self.stacked_experts else out

    # ---- the fused q/k/v projection ---------------------------------------------------------------
    def _qkv_sizes(self) -> list[int]:
        c = self.config
        return [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim]

    def _internal_state(self) -> dict[str, torch.Tensor]:
        """The transformer's state with each layer's q/k/v projections fused as ``attn.qkv.*``."""
        state = dict(self.transformer.state_dict())
        for i in range(self.config.n_layers):
            pre = INTERNAL_LAYER_PREFIX.format(i=i) + "attn."
            for kind in ("weight", "bias"):
                parts = [state.pop(f"{pre}{p}_proj.{kind}", None) for p in "qkv"]
                if parts[0] is not None:
                    state[f"{pre}qkv.{kind}"] = torch.cat(parts, dim=0)  # [(H + 2 Hkv) * hd, ...]
        return state

    def _stack_groups(self, keys) -> dict[str, list[str]]:
        """veomni layout: stacked key -> the per-expert official keys it holds, in expert order."""
        groups: dict[str, dict[int, str]] = {}
        for k in keys:
            m = _PER_EXPERT.match(k)
            if m is not None:
                groups.setdefault(f"{m.group(1)}.{m.group(3)}", {})[int(m.group(2))] = k
        return {k: [d[e] for e in sorted(d)] for k, d in groups.items()}

    def official_shapes(self) -> dict[str, Shape]:
        shapes = {}
        for k, v in self.transformer.state_dict().items():
            if any(f"attn.{p}_proj." in k for p in "kv"):
                continue
            if "attn.q_proj." in k:
                rows = sum(self._qkv_sizes())
                shapes[self.keymap.to_official(k.replace("q_proj", "qkv"))] = (rows,) + tuple(v.shape[1:])
            else:
                shapes[self.keymap.to_official(k)] = tuple(v.shape)
        if self.stacked_experts:
            for stacked, keys in self._stack_groups(list(shapes)).items():
                shapes[stacked] = (len(keys),) + tuple(shapes[keys[0]])
                for k in keys:
                    del shapes[k]
        return shapes

    def official_state_dict(self) -> dict[str, torch.Tensor]:
        state = {self.keymap.to_official(k): v for k, v in self._internal_state().items()}
        if self.stacked_experts:
            for stacked, keys in self._stack_groups(list(state)).items():
                state[stacked] = torch.stack([state.pop(k) for k in keys])  # [E, ...]
        return state

    def load_official(self, reader: CheckpointReader, *, dtype: torch.dtype,
                      device: Union[str, torch.device, None] = None) -> None:
        """As ``TransformerLM.load_official`` (one error listing every missing / unexpected / mis-shaped
        key, non-finite weights refused), splitting each fused ``query_key_value`` into q, k, v and (veomni
        layout) each stacked expert tensor into its experts."""
        found = {k: s for k, s in reader.shapes.items() if not self.keymap.is_ignored(k)}
        check_keys(self.official_shapes(), found, repr(str(reader.directory)))
        state: dict[str, torch.Tensor] = {}
        bad: list[str] = []
        for key in found:
            stacked = _STACKED.match(key)
            if stacked is not None:  # model.layers.L.mlp.experts.up_proj -> layers.L.mlp.experts.{e}.up_proj.weight
                one = self.keymap.to_internal(f"{stacked.group(1)}.0.{stacked.group(2)}.weight")
                internal = None if one is None else one.replace(".experts.0.", ".experts.{e}.")
            else:
                internal = self.keymap.to_internal(key)
            assert internal is not None  # check_keys reported every unknown key
            stored = reader.get(key)
            # copy=True: a fresh (aligned) buffer, not the file's mapping; a one-row expert matmul
            # (matrix-vector) sums in another order on a misaligned weight
            tensor = stored.to(device=device or "cpu", dtype=dtype, copy=True)
            counts = nonfinite_counts(tensor)
            if counts is not None:
                bad.append(f"  {key}: {counts[0]} NaN, {counts[1]} inf of {stored.numel()} values")
            if stacked is not None:  # veomni: [E, ...] -> one tensor per expert
                for e, part in enumerate(tensor.unbind(0)):
                    self.place(state, internal.format(e=e), part.contiguous())
            elif ".attn.qkv." in internal:
                for p, part in zip("qkv", tensor.split(self._qkv_sizes(), dim=0)):
                    self.place(state, internal.replace(".qkv.", f".{p}_proj."), part.contiguous())
            else:
                self.place(state, internal, tensor)
        if bad:
            raise CheckpointError(f"checkpoint {str(reader.directory)!r} has non-finite weights in "
                                  f"{len(bad)} tensor(s):\n" + "\n".join(bad))
        self.assign(state)


def tiny_llada2(seed: int = 0, *, moe: Optional[MoEConfig] = None, dtype: torch.dtype = torch.float32,
                attn_backend: str = "auto", **overrides: Any) -> LLaDA2:
    """A small random LLaDA 2 MoE model (no tokenizer): d 64, 3 layers (the first dense), 4 heads of
    16 (2 KV heads), RoPE on 8 of 16 channels, 8 experts in 4 groups, top-2 from 2 groups, one
    shared expert, block 4, vocab 96 (mask 95, EOS/pad 94). ``overrides``: TransformerConfig fields."""
    from dllm.models.families.init import init_weights

    fields: dict[str, Any] = dict(vocab_size=96, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, mlp_hidden=96,
                                  rope_theta=600000.0, rms_eps=1e-6, max_positions=512, attn_head_dim=16,
                                  qk_norm=True, attention="block_causal", block_size=4, rope_dim=8, rope_fp32=False)
    unknown = sorted(set(overrides) - set(TransformerConfig.field_names()))
    if unknown:
        raise ValueError(f"tiny_llada2(): unknown override(s) {unknown}; valid: TransformerConfig fields "
                         f"({', '.join(TransformerConfig.field_names())}) and moe=MoEConfig(...)")
    fields.update(overrides)
    config = TransformerConfig(**fields)
    moe = moe or MoEConfig(n_experts=8, top_k=2, expert_hidden=32, n_shared=1, n_group=4, topk_group=2,
                           routed_scaling=2.5, first_dense=1)
    special = SpecialIds(mask_id=config.vocab_size - 1, eos_id=config.vocab_size - 2, pad_id=config.vocab_size - 2)
    model = LLaDA2(config, special, moe=moe, attn_backend=attn_backend)
    init_weights(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.transformer.layers:
            if isinstance(layer.mlp, SparseMoE):
                layer.mlp.gate.expert_bias.copy_(0.05 * torch.randn(moe.n_experts, generator=gen))
    return model.to(dtype).eval()


__all__ = ["LLADA2_KEYMAP", "LLaDA2", "moe_from_hf", "moe_to_hf", "tiny_llada2"]
