"""Attention backends: one function signature, several implementations, chosen once per model.

Every backend computes bidirectional (non-causal) grouped-query attention:

    out = softmax(q k^T / sqrt(hd) + mask_bias) v

with ``q`` [B, H, Tq, hd], ``k``/``v`` [B, Hkv, Tk, hd] (H a multiple of Hkv: KV head j serves query
heads j*g .. j*g+g-1, g = H / Hkv, as ``repeat_interleave`` does in LLaDA and Qwen2), and an
optional boolean ``mask`` broadcastable to [B, H, Tq, Tk] (True = may attend).

Backends:
- ``reference``: plain matmul / softmax in float32; the only one that can return the attention
  probabilities (samplers such as DAWN read the last layers' attention).

A query row that the mask lets attend to no key gets output 0 (and probabilities 0) from
``reference`` and ``triton``, as from torch's sdpa (torch >= 2.5), not the NaN of a plain softmax
over -inf (which ``probs @ v`` would spread to every query of the batch row at the next layer,
through the NaN value of that position).
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``; a long padded batch runs
  one unmasked call per group of rows with the same real keys, over those keys (``dllm.kernels.packed``).
- ``sdpa_plain``: the same call with the mask, always (the reference beside ``sdpa``).
- ``triton``: the Triton flash-attention forward (``dllm.kernels.triton.attention``).

``resolve_backend("auto", need_probs=...)``: where ``auto``'s candidates (``sdpa``, ``triton``)
can both run on this host, the ``auto`` backend: ``dllm.kernels.autotune.AutoAttention``, which
times the candidates once per shape bucket and then dispatches each call by one dict lookup
(``auto_decisions()`` lists what it chose and why, ``reset_auto()`` forgets it, ``auto_policy()``
is the object itself). Elsewhere (a CPU, where Triton only runs interpreted; or a request for the
attention probabilities) it is the highest-priority backend that supports the request, and the
reasons the others were refused are recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from dllm.kernels.autotune import AutoAttention, AutoConfig, Decision
from dllm.kernels.autotune import RequestRefused  # noqa: F401  (re-exported: what a backend raises to refuse a call)
from dllm.kernels.packed import few_enough, packed_sdpa, padding_groups, wants_packing
from dllm.registry import Registry

AttentionFn = Callable[..., tuple[torch.Tensor, Optional[torch.Tensor]]]


@dataclass(frozen=True)
class Backend:
    name: str
    fn: AttentionFn
    can_return_probs: bool
    priority: int  # higher wins under "auto" where nothing is measured
    differentiable: bool = True  # autograd flows through fn (False: forward only)

    def refusal(self, *, need_probs: bool) -> str | None:
        """Why this backend cannot serve the request, or None when it can."""
        if need_probs and not self.can_return_probs:
            return f"{self.name}: cannot return attention probabilities"
        return None

    def probe_refusal(self) -> str | None:
        """Why ``auto`` must not time this backend on this host, or None."""
        return self.refusal(need_probs=False)

    def request_refusal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                        return_probs: bool, needs_grad: bool) -> str | None:
        """Why this backend cannot serve a call with these tensors (shapes, dtypes, devices and
        mask kind only: no host sync), or None."""
        if return_probs and not self.can_return_probs:
            return f"{self.name}: cannot return attention probabilities"
        if needs_grad and not self.differentiable:
            return f"{self.name}: forward only (no backward pass), and autograd needs this output"
        return None


backends: Registry[Backend] = Registry("attention backend")


def _expand_kv(k: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, Hkv, T, hd] -> [B, H, T, hd] by repeating each KV head for its group of query heads."""
    groups = n_heads // k.shape[1]
    return k if groups == 1 else k.repeat_interleave(groups, dim=1)


def reference_attention(
    q: torch.Tensor,  # [B, H, Tq, hd]
    k: torch.Tensor,  # [B, Hkv, Tk, hd]
    v: torch.Tensor,  # [B, Hkv, Tk, hd]
    mask: Optional[torch.Tensor] = None,  # bool, broadcastable to [B, H, Tq, Tk]
    return_probs: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    k = _expand_kv(k, q.shape[1])
    v = _expand_kv(v, q.shape[1])
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [B, H, Tq, Tk]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(dim=-1)
    if mask is not None:  # a query row with no allowed key: 0 (as sdpa and triton), not softmax's NaN
        probs = probs.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    out = (probs @ v.float()).to(q.dtype)
    return out, (probs if return_probs else None)


_SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # torch >= 2.5


def _sdpa(q, k, v, mask, return_probs: bool, name: str) -> tuple[torch.Tensor, None]:
    """One ``F.scaled_dot_product_attention`` call with the mask; grouped KV heads are read in place
    (``enable_gqa``) where torch has it, else expanded first (the same values)."""
    if return_probs:
        raise ValueError(f"the {name} attention backend cannot return attention probabilities; "
                         "use attn_backend='reference'")
    if k.shape[1] == q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False), None
    if _SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False, enable_gqa=True), None
    k = _expand_kv(k, q.shape[1])
    v = _expand_kv(v, q.shape[1])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False), None


def sdpa_attention(
    q: torch.Tensor,  # [B, H, Tq, hd]
    k: torch.Tensor,  # [B, Hkv, Tk, hd]
    v: torch.Tensor,  # [B, Hkv, Tk, hd]
    mask: Optional[torch.Tensor] = None,  # bool, broadcastable to [B, H, Tq, Tk]
    return_probs: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """sdpa; a long padded batch attends to each row's real keys only (``dllm.kernels.packed``)."""
    if not return_probs and wants_packing(q, k, mask):
        groups = padding_groups(mask)
        if groups is not None and few_enough(groups, q.device):
            return packed_sdpa(q, _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1]), groups), None
    return _sdpa(q, k, v, mask, return_probs, "sdpa")


def sdpa_plain_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    return_probs: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``sdpa`` without its padded-batch path: one masked call, always; the reference beside it."""
    return _sdpa(q, k, v, mask, return_probs, "sdpa_plain")


backends.add("reference", Backend("reference", reference_attention, True, 0),
             description="plain PyTorch matmul/softmax in float32; can return attention probabilities")
backends.add("sdpa", Backend("sdpa", sdpa_attention, False, 10),
             description="torch scaled_dot_product_attention (flash / memory-efficient / math kernels); "
                         "long padded batches attend to each row's real keys only (dllm.kernels.packed)")
backends.add("sdpa_plain", Backend("sdpa_plain", sdpa_plain_attention, False, 1),
             description="sdpa as one masked call, without the padded-batch path (the reference beside sdpa)")


# Triton, registered lazily: nothing is imported until the backend is resolved or called. It can
# run with triton installed on a CUDA device, or on CPU under TRITON_INTERPRET=1 (tests only: slow);
# otherwise its refusal says why, so "auto" records it and attn_backend="triton" raises it. "auto"
# times it against sdpa on CUDA tensors only; it takes boolean masks whose rows' key sets are nested
# (padding, block-causal: ``dllm.kernels.triton.padding``), and has no backward.
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class _LazyTritonBackend(Backend):
    def refusal(self, *, need_probs: bool) -> str | None:
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            return f"{self.name}: triton is not installed (pip install triton)"
        from dllm.kernels.triton.attention import unavailable_reason

        reason = unavailable_reason()
        return f"{self.name}: {reason}" if reason else super().refusal(need_probs=need_probs)

    def probe_refusal(self) -> str | None:
        if not torch.cuda.is_available():  # checked first: nothing imports triton on a CPU-only host
            return f"{self.name}: no CUDA device (on CPU Triton runs only interpreted: too slow to time, not probed)"
        reason = self.refusal(need_probs=False)
        if reason is None:
            from dllm.kernels.triton.attention import _attn_fwd_kernel, _interpreted

            if _interpreted(_attn_fwd_kernel):
                return f"{self.name}: runs in the Triton interpreter here (CPU): too slow to time, not probed"
        return reason

    def request_refusal(self, q, k, v, mask, return_probs, needs_grad) -> str | None:
        reason = super().request_refusal(q, k, v, mask, return_probs, needs_grad)
        if reason is not None:
            return reason
        if mask is not None and (mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1):
            return (f"{self.name}: takes boolean masks [B, 1, 1|Tq, Tk] only, got "
                    f"{mask.dtype} {tuple(mask.shape)}")
        if mask is not None and mask.shape[2] != 1:  # a row mask (SDAR's block-causal, ragged batches' pad rows)
            return (f"{self.name}: converts a [B, 1, Tq, Tk] mask to per-key counts and per-row thresholds with a "
                    f"host read per new mask (to check that its rows' key sets are nested), which a CUDA graph "
                    f"capture cannot make, so auto leaves row masks to sdpa (got {tuple(mask.shape)}; "
                    f"attn_backend='triton' takes nested ones eagerly: padding, pad queries, block-causal)")
        if q.device.type != "cuda":
            return f"{self.name}: needs CUDA tensors, got {q.device.type}"
        if q.dtype not in _TRITON_DTYPES or q.shape[-1] > 256:
            return f"{self.name}: takes float32/float16/bfloat16 with head dim <= 256, got {q.dtype}, {q.shape[-1]}"
        return None


def _triton_attention(q, k, v, mask=None, return_probs=False):
    from dllm.kernels.triton.attention import triton_attention

    return triton_attention(q, k, v, mask, return_probs)


backends.add("triton", _LazyTritonBackend("triton", _triton_attention, False, 5, differentiable=False),
             description="Triton flash-attention forward (GQA in-kernel, padding and block-causal masks; "
                         "dllm.kernels.triton.attention)")


@dataclass(frozen=True)
class Resolution:
    backend: Backend
    refused: tuple[str, ...]  # human-readable reasons, one per refused backend


# The process-wide "auto" policy: one decision table shared by every model resolved to "auto".
_auto = AutoAttention(AutoConfig(), backends.get)
AUTO = Backend("auto", _auto, True, 100)  # return_probs is served through the fallback (reference)


def auto_policy() -> AutoAttention:
    """The ``auto`` backend's policy object (``configure(AutoConfig(...))`` changes what it times)."""
    return _auto


def auto_decisions() -> list[Decision]:
    """What ``auto`` chose per shape bucket in this process: (key, chosen, {backend: us}, refused)."""
    return _auto.decisions()


def reset_auto() -> None:
    """Forget ``auto``'s decisions: the next call of every bucket is probed again."""
    _auto.reset()


def resolve_backend(name: str = "auto", *, need_probs: bool = False) -> Resolution:
    """A backend by name; or, for "auto", the measuring ``AUTO`` where at least two of its
    candidates can run on this host, else the highest-priority backend that serves the request."""
    if name != "auto":
        backend = backends.get(name)
        reason = backend.refusal(need_probs=need_probs)
        if reason is not None:
            raise ValueError(f"attention backend {name!r} cannot serve this request: {reason}")
        return Resolution(backend, ())
    refused: list[str] = []
    if not need_probs:
        usable, refused = _auto.host_candidates()
        if len(usable) >= 2:
            return Resolution(AUTO, tuple(refused))
    for entry in sorted(backends, key=lambda e: -e.obj.priority):
        reason = entry.obj.refusal(need_probs=need_probs)
        if reason is None:
            return Resolution(entry.obj, tuple(dict.fromkeys(refused)))
        refused.append(reason)
    raise ValueError("no attention backend can serve this request: " + "; ".join(refused))
