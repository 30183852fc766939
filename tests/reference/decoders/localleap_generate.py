"""Reference transcription of DAWN's LocalLeap decoder (lizhuo-luo/DAWN at ab42898; LocalLeap: arXiv
2510.07081), restated from the public code for ``dllm``'s tests; no code copied:

* LLaDA: ``llada/generate.py`` ``generate(..., local_leap=True)`` (the only driver that dispatches to it;
  no cache) and ``get_transfer_index_localleap``; the scripts (``llada/eval_*.sh``) run it with
  ``threshold=0.9, relaxed_threshold=0.75, radius=4``, block 32, ``temperature=0``;
* Dream: ``dream/model/generation_utils.py`` ``_sample_block`` with ``alg='local_leap'`` and
  ``get_transfer_index_localleap``; the scripts (``dream/eval_*.sh``) run it with ``conf_threshold=0.9,
  relaxed_threshold=0.8, radius=4``, block 32, greedy.

The loop (both): per block, until the block has no masks, one full forward and one commit. The LLaDA
driver tests the block after the commit, Dream's before the forward: the same forwards on a fresh block.

One step, batch 1, over the masks ``M`` of the canvas left of the block's end (earlier blocks are full):
confidence ``c`` = ``softmax(float64(logits))[x0]`` (LLaDA; ``x0`` the arg-max, at T > 0 that of the
float64 Gumbel-perturbed logits) or Dream's ``sample_tokens`` (``softmax`` in the logits dtype, ``max``),
``-inf`` off ``M``; ``torch.topk(c, |M|)``; rank 0 is always committed; anchors are the masks with
``c >= threshold``; when there is one, a later rank at position i needs ``c >= relaxed_threshold`` if some
anchor j has ``|i - j| <= radius`` (the neighbourhood clipped to the canvas) and ``c >= threshold``
otherwise; without an anchor every later rank needs ``c >= threshold``.

This is an *oracle*: dtypes, the ``torch.topk`` call and the Python neighbourhood set are as in the
original. Differences, inert for what is tested:

* the model is ``model_fn(x) -> logits [1, L, V]`` (raw: the Dream path applies Dream's shift itself);
  the mask id is a parameter; ``remasking='random'``, the Dream hooks, history and timing are omitted;
* the float64 uniforms of the Gumbel-max are drawn over the whole canvas as in the original, ``torch.rand``
  of shape [1, L, V] on ``generator`` (the stream of ``torch.rand_like`` on a global generator seeded
  alike); the Dream path is greedy only (its ``Categorical`` draw is not transcribed);
* ``forbid_mask_commit=True`` raises :class:`~.llada_generate.MaskCommitError` where a committed proposal
  is the mask id (the original leaves the position masked; ``dllm`` never proposes it);
* ``forbid_ties=True`` raises :class:`~.llada_generate.AmbiguousTieError` where the result depends on
  ``topk``'s order among equal confidences: several masks share the largest confidence and it is below
  ``threshold`` (then only the one ``topk`` ranks first is committed).

Returns ``(x, nfe)``: the canvas [1, Lp + gen_length] and the number of forwards.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .dream_generate import dream_sample_tokens
from .llada_generate import AmbiguousTieError, MaskCommitError

__all__ = ["gumbel_noisy", "localleap_generate", "localleap_transfer"]

ModelFn = Callable[[torch.Tensor], torch.Tensor]


def gumbel_noisy(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
    """``add_gumbel_noise`` (float64 ``exp(l) / (-log u)^T``, the uniforms ``torch.rand`` over all of logits
    [1, L, V]; the logits themselves at T = 0)."""
    if temperature == 0:
        return logits
    logits64 = logits.to(torch.float64)
    noise = torch.rand(logits64.shape, dtype=torch.float64, generator=generator)
    return logits64.exp() / (-torch.log(noise)) ** temperature


def localleap_transfer(confidence: torch.Tensor, mask_index: torch.Tensor, threshold: float,
                       relaxed_threshold: Optional[float], radius: int, forbid_ties: bool = False) -> torch.Tensor:
    """``get_transfer_index_localleap``'s selection for one row: confidence [L] (-inf off the masks),
    mask_index [L] bool -> transfer [L] bool."""
    n = int(mask_index.sum())
    transfer = torch.zeros_like(mask_index)
    _, select = torch.topk(confidence, k=n)  # [n], by confidence
    transfer[select] = True
    if n == 0:
        return transfer
    if forbid_ties:
        top = confidence == confidence[select[0]]  # [L]
        if int(top.sum()) > 1 and float(confidence[select[0]]) < threshold:
            raise AmbiguousTieError("LocalLeap reference: the top-1 is tied below the threshold")
    positions = torch.where(mask_index)[0]  # [n]
    neighbours: set[int] = set()
    use_leap = False
    if relaxed_threshold is not None:
        anchors = positions[confidence[positions] >= threshold]
        use_leap = anchors.numel() >= 1
        for pos in anchors.tolist():
            neighbours.update(range(max(0, pos - radius), min(confidence.shape[0], pos + radius + 1)))
    for k in range(1, n):
        pos = int(select[k])
        bar = relaxed_threshold if use_leap and pos in neighbours else threshold
        if confidence[pos] < bar:
            transfer[pos] = False
    return transfer


def _llada_step(logits: torch.Tensor, x: torch.Tensor, mask_index: torch.Tensor, temperature: float,
                generator: Optional[torch.Generator]) -> tuple[torch.Tensor, ...]:
    """LLaDA's proposals and confidences: (x0 [1, L], confidence [1, L] float64, -inf off the masks)."""
    x0 = torch.argmax(gumbel_noisy(logits, temperature, generator), dim=-1)  # [1, L]
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)  # [1, L] float64
    x0 = torch.where(mask_index, x0, x)
    return x0, torch.where(mask_index, x0_p, torch.tensor(float("-inf"), dtype=x0_p.dtype))


def _dream_step(logits: torch.Tensor, x: torch.Tensor, mask_index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Dream's greedy ``sample_tokens`` on the shifted logits: (x0 [1, L], confidence [1, L], -inf off the masks)."""
    logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # [1, L, V] Dream's shift
    conf, x0 = dream_sample_tokens(logits)  # [1, L] each, logits dtype
    return x0, torch.where(mask_index, conf, torch.tensor(float("-inf"), dtype=conf.dtype))


@torch.no_grad()
def localleap_generate(
    model_fn: ModelFn,
    prompt: torch.Tensor,
    *,
    gen_length: int,
    block_length: int,
    mask_id: int,
    family: str = "llada",
    threshold: float = 0.9,
    relaxed_threshold: Optional[float] = 0.75,
    radius: int = 4,
    temperature: float = 0.0,
    generator: Optional[torch.Generator] = None,
    forbid_mask_commit: bool = False,
    forbid_ties: bool = False,
) -> tuple[torch.Tensor, int]:
    """prompt [1, Lp] -> (canvas [1, Lp + gen_length], forwards). ``family``: ``"llada"`` or ``"dream"``."""
    assert prompt.shape[0] == 1, "batch 1, as the scripts run it"
    assert family in ("llada", "dream") and (family == "llada" or temperature == 0)
    lp = prompt.shape[1]
    x = torch.full((1, lp + gen_length), mask_id, dtype=torch.long)
    x[:, :lp] = prompt
    assert gen_length % block_length == 0
    nfe = 0
    for start in range(lp, lp + gen_length, block_length):
        end = start + block_length
        while bool((x[:, start:end] == mask_id).any()):
            mask_index = x == mask_id  # [1, L]
            mask_index[:, end:] = False
            logits = model_fn(x)  # [1, L, V]
            nfe += 1
            if family == "llada":
                x0, conf = _llada_step(logits, x, mask_index, temperature, generator)
            else:
                x0, conf = _dream_step(logits, x, mask_index)
            transfer = localleap_transfer(conf[0], mask_index[0], threshold, relaxed_threshold, radius,
                                          forbid_ties)[None]  # [1, L]
            if forbid_mask_commit and bool((x0[transfer] == mask_id).any()):
                raise MaskCommitError(f"LocalLeap reference would commit the mask id (block at {start})")
            x[transfer] = x0[transfer]
    return x, nfe
