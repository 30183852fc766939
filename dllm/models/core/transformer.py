"""The one transformer behind every checkpoint family (LLaDA, Dream: bidirectional; SDAR: block-causal).

Pre-norm blocks: ``h += attn(rms(h))``, ``h += mlp(rms(h))``; rotate-half RoPE from explicit integer
positions (so left-padded rows get the same positions as the prompt alone); grouped-query attention
through a pluggable backend from ``dllm.kernels.attention``; SwiGLU MLP; final RMSNorm; LM head
(or the tied embedding). No causal mask for the bidirectional families; a block-causal model
(``TransformerConfig.attention = "block_causal"``, SDAR arXiv 2510.06303) adds the mask
``block(key) <= block(query)`` with ``block(p) = p // block_size`` of the RoPE positions
(``block_causal_mask``), ANDed with the padding mask. Qwen3-style models (SDAR) also normalise each
head's q and k (``qk_norm``) before RoPE and may have ``head_dim != d_model / n_heads``.

Parameter names are internal (``embed``, ``layers.N.attn.q_proj`` ...); ``families/keymap.py`` and the
family files translate them to the official checkpoint names.

The layers (``dllm.models.core.layer.block``) are small modules with the projection (``Attention.qkv``)
split from the attention itself. A cached forward (``dllm.cache``) runs the layers on a slice of
query positions: between the two, the layer hands its fresh (rotated) k/v to the cache view, which
writes them into the preallocated buffers in place and returns the keys/values to attend.
"""

from __future__ import annotations

import functools
from typing import Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm.kernels.attention import AttentionFn, backends, resolve_backend
from dllm.models.core.config import TransformerConfig
from dllm.models.core.layer.fused import FusedLayer, call_module, linear_or_module, plain_weight
from dllm.models.core.kv import CacheView, StackedView
from dllm.models.core.views.packed import PackedView
from dllm.models.core.layer.norm import RMSNorm, fused_norm, rms_norm  # noqa: F401 (rms_norm: re-exported)
from dllm.models.core.layer.rope import RopeTable, apply_rope, rope_cos_sin, rope_inv_freq, rope_rows, rotate_half  # noqa: F401
from dllm.models.core.layer.block import TransformerBlock, block_causal_mask, combine_masks


def normalize_layers(indices: Iterable[int], n_layers: int, what: str) -> tuple[int, ...]:
    """Map possibly negative layer indices to 0..n_layers-1 (sorted, unique); error when out of range."""
    out: set[int] = set()
    for i in indices:
        if not isinstance(i, int) or isinstance(i, bool) or not -n_layers <= i < n_layers:
            raise ValueError(
                f"{what}: layer index {i!r} is out of range for a model with {n_layers} layers "
                f"(valid: {-n_layers} .. {n_layers - 1})"
            )
        out.add(i % n_layers)
    return tuple(sorted(out))


def embedding(n: int, d: int) -> nn.Embedding:
    """``nn.Embedding(n, d)``; built on the meta device (``dllm.models.loading``: the weights are read
    next) without its ``normal_`` init, whose meta kernel (``torch._refs``) imports ``torch._dynamo``,
    about 1.5 s of every process that loads a checkpoint."""
    if torch.get_default_device().type == "meta":  # inside ``with torch.device("meta")``
        return nn.Embedding(n, d, _weight=torch.empty(n, d))
    return nn.Embedding(n, d)


class Transformer(nn.Module):
    """Embedding -> n_layers TransformerBlocks -> RMSNorm -> LM head (or tied embedding)."""

    def __init__(self, cfg: TransformerConfig, attn_backend: str = "auto") -> None:
        super().__init__()
        self.config = cfg
        self.embed = embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_eps, cfg.norm_round_once)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.attn_backend = ""
        self._attn_fn: AttentionFn
        self.set_attn_backend(attn_backend)
        # None: fused layers for every dtype but float32 (where the module-by-module reference is
        # kept bit-identical to the official code); True / False force one path (``set_fused``)
        self.fused: Optional[bool] = None
        # None: the one-launch norm/RoPE operators (dllm.kernels.fused_ops) for CUDA weights; True /
        # False force them (True on a CPU runs their reference: what a GPU would launch, counted)
        self.fused_ops: Optional[bool] = None
        self._rope_table = RopeTable(cfg.rope_dim or cfg.head_dim, cfg.rope_theta)
        self._fused_layers: Optional[list[FusedLayer]] = None  # built on first use; [] = cannot fuse
        self._plain_head = False  # with the fused layers: the LM head may run as F.linear (a plain nn.Linear)
        self.register_load_state_dict_post_hook(lambda module, keys: module.invalidate_fused())

    def set_fused(self, fused: Optional[bool], *, ops: Optional[bool] = None) -> None:
        """Choose the layer path: True (fused projections, one-op norms, table RoPE), False (module by
        module, the reference), None (fused unless the weights are float32). ``ops``: norms and RoPE
        as the one-launch operators of ``dllm.kernels.fused_ops`` (None: for CUDA weights)."""
        for name, value in (("fused", fused), ("ops", ops)):
            if value not in (None, True, False):
                raise ValueError(f"{name} must be True, False or None (by dtype / device), got {value!r}")
        self.fused, self.fused_ops = fused, ops
        self._fused_layers = None

    def invalidate_fused(self) -> None:
        """Fuse again at the next forward: call after replacing projection weights by assignment
        (``load_state_dict``, ``.to()`` and ``dllm.models.quantize`` call it themselves)."""
        self._fused_layers = None

    def _apply(self, fn, recurse: bool = True):  # .to(), .cuda(), .half(): new parameter memory
        self._fused_layers = None
        return super()._apply(fn, recurse)

    def fused_layers(self) -> Optional[list[FusedLayer]]:
        """Each layer's fused weights when this forward runs the fused path, else None: asked for
        (or by dtype), no autograd, an even rotary width, every layer fusable (layers whose attention
        maps are asked for run their attention on the ``reference`` backend, on the fused path too).
        Weights are fused once (again after ``invalidate_fused``); each forward checks one pointer."""
        cfg = self.config
        if self.fused is False or torch.is_grad_enabled():
            return None
        state = self._fused_layers  # built only past the dtype test below (a dtype change unfuses)
        if state and state[0].qkv.linears[0]._parameters["weight"].data_ptr() != state[0].qkv.weight.data_ptr():
            state = None  # a projection was replaced by assignment
        if state is None and self.fused is None and self.embed.weight.dtype == torch.float32:
            return None
        if state is None:
            pairs = [layer.fused_weights() for layer in self.layers]
            rotary = cfg.rope_dim or cfg.head_dim
            ok = rotary % 2 == 0 and all(p is not None for p in pairs)
            ops = self.embed.weight.is_cuda if self.fused_ops is None else self.fused_ops
            self._plain_head = self.lm_head is not None and plain_weight(self.lm_head) is not None
            state = self._fused_layers = [
                FusedLayer(p[0], p[1], ops, layer.attn, layer.mlp, layer.attn_norm, layer.mlp_norm, layer.attn.o_proj,
                           None if p[1] is None else layer.mlp.down_proj, plain_weight(layer.attn.o_proj),
                           None if p[1] is None else plain_weight(layer.mlp.down_proj))
                for layer, p in zip(self.layers, pairs) if p is not None] if ok else []
        return state or None

    def fused_ready(self) -> bool:
        """Whether a forward now would run the fused layers (``fused_layers``)."""
        return self.fused_layers() is not None

    @property
    def attn_fn(self) -> AttentionFn:
        """The resolved attention backend's function (``set_attn_backend``)."""
        return self._attn_fn

    def set_attn_backend(self, name: str) -> str:
        """Resolve ``name`` ("auto", "sdpa", "reference", ...) once; returns the resolved name."""
        resolution = resolve_backend(name)
        self.attn_backend = resolution.backend.name
        self._attn_fn = resolution.backend.fn
        return self.attn_backend

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype, cache, *,
                   pair: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The RoPE table rows of ``positions`` [B, T] (kept on a reused cache view): ``pair``: (cos, signed
        sin) [B, T, 1, hd] each, unbound once for every layer; else (the table [B, T, 2, 1, hd], None),
        what the one-launch ``dllm::rope_rows`` takes."""
        # a bound on the positions known without reading them: the checkpoint's length, the query's, the
        # cache's (default positions never pass the longer of the last two; past all: ``lookup``)
        kv = getattr(cache, "kv", None)
        bound = max(self.config.max_positions, positions.shape[-1] - 1, 0 if kv is None else kv.length - 1)

        def make() -> tuple[torch.Tensor, Optional[torch.Tensor]]:
            table = self._rope_table.lookup(positions, dtype, bound)
            return table.unbind(2) if pair else (table, None)

        return make() if cache is None else cache.memoized(f"rope_rows:{dtype}:{pair}", (positions,), make)

    def _block_causal(self, positions: torch.Tensor, attn_mask: Optional[torch.Tensor], cache) -> torch.Tensor:
        """``attn_mask`` ANDed with the block-causal mask of the queries' ``positions`` [B, T] and
        the keys' (their own, or the cache's ``key_positions``) -> bool [B, 1, T, K]; kept on a
        reused cache view (whose keys' positions were recorded by the forward that made it)."""
        assert self.config.block_size is not None
        bs = self.config.block_size

        def make() -> torch.Tensor:
            t = positions.shape[1]
            stacked = isinstance(cache, StackedView) and cache.every_row  # one variant's mask per row: [R, 1, T/g, K]
            if (type(cache) is CacheView or stacked) and cache.kv.positions_fixed and not cache.n_extra:  # the canvas' ids
                return combine_masks(attn_mask, cache.kv.block_mask(cache.start, t // cache.group if stacked else t,
                                                                    cache.key_end, bs))
            k_pos = positions if cache is None else cache.key_positions(positions)  # [B, K]
            return combine_masks(attn_mask, block_causal_mask(positions, k_pos, bs))

        return make() if cache is None else cache.memoized("block_causal", (positions, attn_mask), make)

    def head_weight(self) -> torch.Tensor:
        """[V, D] matrix of the LM head (the embedding when tied)."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def new_kv_cache(self, rows: int, length: int):
        """Preallocated K/V buffers (``dllm.models.core.kv.KVCache``) for ``rows`` x ``length`` canvas
        columns, one pair per layer, each on its layer's device, in the model dtype."""
        from dllm.models.core.kv import KVCache

        cfg = self.config
        first = self.layers[0].attn.k_proj.weight
        devices = [layer.attn.k_proj.weight.device for layer in self.layers]
        return KVCache.allocate(cfg.n_layers, rows, cfg.n_kv_heads, length, cfg.head_dim,
                                dtype=first.dtype, devices=devices)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T] int
        positions: torch.Tensor,  # [B, T] int >= 0, explicit RoPE positions (fused path: a negative one wraps, RopeTable)
        attn_mask: Optional[torch.Tensor] = None,  # bool [B, 1, Tq, Tk], True = attend; None = all
        want_attn_layers: tuple[int, ...] = (),
        want_hidden_layers: tuple[int, ...] = (),
        cache=None,  # dllm.models.core.kv.CacheView, a PackedView (packed tokens, no cache) or None
        head_rows: Optional[tuple[int, int]] = None,  # (a, b): the final norm and LM head on rows [a, b) only
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Returns (logits [B, T, V] in the model dtype, hidden {i: [B, T, D]}, attn {i: [B, H, T, K] f32}).

        hidden[i] is the output of layer i (0-based; negative indices are normalised, -1 = last).
        Layers in ``want_attn_layers`` run on the ``reference`` backend, which returns probabilities.
        With ``cache`` (a ``CacheView``) the T rows are canvas columns ``[cache.start, cache.start + T)``
        and attend to K = ``cache.key_end`` cached keys (their own fresh ones written in first);
        ``attn_mask`` is then [B, 1, T|1, K]. A block-causal model ANDs ``attn_mask`` with
        ``block_causal_mask`` of the query positions and the keys' positions (the queries' own
        without a cache, else ``cache.key_positions``).
        """
        n = self.config.n_layers
        attn_layers = normalize_layers(want_attn_layers, n, "want_attn_layers") if want_attn_layers else ()
        hidden_layers = normalize_layers(want_hidden_layers, n, "want_hidden_layers") if want_hidden_layers else ()
        probs_fn = backends.get("reference").fn if attn_layers else self._attn_fn
        rope_dim = self.config.rope_dim or self.config.head_dim  # partial rotary: rope_dim < hd
        sin: Optional[torch.Tensor]
        fused = self.fused_layers()
        if fused is not None:
            dtype = torch.float32 if self.config.rope_fp32 else fused[0].qkv.weight.dtype
            cos, sin = self._rope_rows(positions, dtype, cache, pair=not fused[0].ops)
        else:
            cos, sin = rope_cos_sin(positions, rope_dim, self.config.rope_theta)  # [B, 1, T, rope_dim]
        if self.config.block_causal:
            attn_mask = self._block_causal(positions, attn_mask, cache)
        mods = self._modules  # submodules read from the dict: Module.__getattr__ is a Python call per read
        embed = mods["embed"]
        if fused is None or embed._forward_hooks or embed._forward_pre_hooks or type(embed) is not nn.Embedding:
            h = embed(input_ids)  # [B, T, D] (a hooked embedding runs as a module: soft inputs, timers)
        else:
            h = torch.embedding(embed._parameters["weight"], input_ids)  # F.embedding's op, without its wrapper
        hidden: dict[int, torch.Tensor] = {}
        attn: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(mods["layers"]):
            kv_attend = None if cache is None else functools.partial(cache.attend, i)
            want_probs = i in attn_layers
            args = (h, cos, sin, attn_mask, probs_fn if want_probs else self._attn_fn, want_probs, kv_attend,
                    None if fused is None else fused[i])
            h, probs = layer(*args) if fused is None else call_module(layer, *args)  # fused: no __call__ unless hooked
            if want_probs:
                assert probs is not None
                attn[i] = probs
            if i in hidden_layers:
                hidden[i] = h
        if isinstance(cache, PackedView):  # the packed tokens back in their rows: [B, T | b - a, D]
            h = cache.query_rows(h, *(head_rows or (0, cache.columns)))
        elif isinstance(cache, StackedView) and head_rows is not None:  # every variant's rows [a, b)
            h = cache.query_rows(h, *head_rows)  # [B, g * (b - a), D]
        elif head_rows is not None and (head_rows[0] != 0 or head_rows[1] != h.shape[1]):
            h = h[:, head_rows[0]:head_rows[1]]  # [B, b - a, D]: norm and head are per row
        norm = mods["norm"]
        hooked = bool(norm._forward_hooks or norm._forward_pre_hooks)  # a timer's hooks see the module
        h = norm(h) if fused is None or hooked else fused_norm(norm, h, fused[0].ops)
        head = mods.get("lm_head")  # None when tied (then a plain attribute)
        if head is not None:  # [B, T, V]; a module call where device-map or timer hooks must run
            plain = fused is not None and self._plain_head
            logits = linear_or_module(head, head._parameters["weight"] if plain else None, h)
        else:
            logits = F.linear(h, embed.weight.to(h.device))
        return logits, hidden, attn
