"""The models' boolean attention masks as the Triton attention kernel's contract
(``dllm.kernels.triton.attention.flash_attention``): key padding [B, Tk] and, for square masks of the
form ``keys | pad_queries``, the pad-query rows [B, Tq]; any other mask is refused
(``UnsupportedMaskError``, a ``RequestRefused``: ``attn_backend="auto"`` then takes its fallback)."""

from __future__ import annotations

import threading
from typing import Optional

import torch

from dllm.kernels.autotune import RequestRefused
from dllm.kernels.packed import tensor_version


class UnsupportedMaskError(RequestRefused):
    """The mask is not of a form the kernel can express (key padding, optionally with pad queries)."""


# The models pass ONE mask object to every layer of a forward: remember the last conversion so the
# check below (a host sync) runs once per forward, not once per layer. Holding the tensor keeps its
# id from being reused; ``tensor_version`` catches in-place edits, except on inference-mode tensors, which
# have no version counter: those are assumed not to be edited in place between calls (the models
# build a fresh mask per forward). The conversion depends on the batch and query count a broadcast
# mask is expanded to, so they are part of the key; one memo per thread (``dllm.kernels.packed``).
class _Memo(threading.local):
    def __init__(self) -> None:
        self.last: Optional[tuple] = None  # (mask, version or None, batch, n_queries, (key_padding, query_attends_all))


_memo = _Memo()


def mask_to_key_padding(
    mask: torch.Tensor, batch: int, n_queries: int, n_keys: int
) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """bool mask broadcastable to [B, 1, Tq, Tk] -> (key_padding [B, Tk], query_attends_all [B, Tq] | None).

    Accepted: [B|1, 1, 1, Tk] (pure key padding) and [B|1, 1, Tq, Tk] equal to
    ``keys[:, None, :] | pad_queries[:, :, None]`` (what ``padding_attn_mask`` and
    ``CacheView.attn_mask`` build). Anything else (per-head masks, float masks, masks that are
    not of that form) raises ``UnsupportedMaskError``.
    """
    if mask.dtype != torch.bool:
        raise UnsupportedMaskError(f"the triton attention backend takes boolean masks only, got {mask.dtype}")
    if (mask.dim() != 4 or mask.shape[0] not in (1, batch) or mask.shape[1] != 1
            or mask.shape[2] not in (1, n_queries) or mask.shape[3] != n_keys):
        raise UnsupportedMaskError(
            f"the triton attention backend takes key-padding masks [B, 1, 1, Tk] or [B, 1, Tq, Tk] "
            f"(B={batch}, Tq={n_queries}, Tk={n_keys}), got {tuple(mask.shape)}; use attn_backend='sdpa'")
    last = _memo.last  # read once: another call may replace it meanwhile
    if (last is not None and last[0] is mask and last[1] == tensor_version(mask)
            and last[2] == batch and last[3] == n_queries):
        return last[4]
    m = mask[:, 0].expand(batch, mask.shape[2], n_keys)  # [B, Tq|1, Tk]
    if mask.shape[2] == 1:
        result = (m[:, 0], None)
    elif mask.is_cuda and torch.cuda.is_current_stream_capturing():  # the check below reads the mask back
        raise UnsupportedMaskError(
            f"the triton attention backend reads a new [B, 1, Tq, Tk] mask back to check its form, which a CUDA "
            f"graph capture cannot do (got {tuple(mask.shape)}); use attn_backend='sdpa' or 'auto' with cuda_graphs")
    else:
        keys = m.all(dim=1)  # [B, Tk]: a key is real iff every real query may see it
        pad_q = m.all(dim=2) & ~keys.all(dim=1, keepdim=True)  # [B, Tq]: pad queries see everything
        # (a row without padded keys needs no pad-query flags: every query sees every key anyway)
        if not bool(((keys[:, None, :] | pad_q[:, :, None]) == m).all()):  # host sync, once per mask
            raise UnsupportedMaskError(
                "the triton attention backend supports masks of the form key_padding | pad_queries "
                "only (padding masks); this mask is not one; use attn_backend='sdpa' or 'reference'")
        result = (keys, pad_q if bool(pad_q.any()) else None)
    _memo.last = (mask, tensor_version(mask), batch, n_queries, result)
    return result


__all__ = ["UnsupportedMaskError", "mask_to_key_padding"]
