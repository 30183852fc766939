"""Reference transcription of dInfer's credit decoder (inclusionAI/dInfer at fce4e32; CreditDecoding,
arXiv 2510.06133; dInfer, arXiv 2510.08666), restated from the public code for ``dllm``'s tests; no code
copied:

* the rule: ``python/dinfer/decoding/parallel_strategy.py`` ``CreditThresholdParallelDecoder``
  (``_apply_credit_fusion`` and ``decode``) and the threshold rule it calls,
  ``get_transfer_index_threshold`` (``rm_mask=True``, ``use_float64=False``: the decoder's defaults);
* the loops: dInfer's ``BlockWiseDiffusionLLM`` / ``BlockDiffusionLLMAttnmask`` as transcribed for the
  hierarchical decoder in :mod:`.hierarchy_generate` (its module docstring), REUSED here: that file's
  loops take any decoder with ``decode(logits, x, start, end, mask_id, forbid_mask_commit) -> bool`` as
  their ``rule``; :func:`credit_generate` and :func:`credit_generate_bd` pass a :class:`CreditDecoder`.

One ``decode`` (block columns ``[start, end)`` of the canvas, logits [B, W, V]; ``m`` = the block's masks):

* credit (``_apply_credit_fusion``, keyed by ``(start, end)``): a float32 [B, W, V] matrix ``C``, zeros on
  the key's first call, else ``C <- beta * C``; ``p = softmax(float32(l))``, ``(p1, t1) = max(p)`` (the
  mask id included; the first index among equal maxima); ``C[t1] += p1 ** gamma`` where ``m``; the
  fused logits are ``l + alpha * log(C + 1)``;
* threshold (``get_transfer_index_threshold`` on the fused logits ``f``): ``x0 = argmax(gumbel(f, T))``,
  ``c = softmax(float32(f))[x0]``; a position whose ``x0`` is the mask id leaves the candidates (it
  stays masked); ``c`` is ``-inf`` off the candidates; commit every candidate with
  ``c >= min(max(c) - 1e-5, threshold)`` (so the most confident, and every one within 1e-5 of it);
* after the commit, when the canvas ``x`` holds no mask any more, every key's credit is dropped.

Differences, inert for what is tested:

* a block decoded ``max_decodes`` times (default 1000) raises :class:`StalledError`; dInfer has no cap.
  Where the fused arg-max of every mask left in a block is the mask id, nothing is committed, the
  canvas and so the logits stay the same, the mask id gains credit, and dInfer's greedy loop never
  ends (the random tiny LLaDA 2 of the tests does this on 3 of its 16 prompts);
* the canvas is a tensor (dInfer: a ``TokenArray``; ``has_mask`` reads ``x.data``, the whole canvas);
* the credit lives in the :class:`CreditDecoder` object as in dInfer; one object per ``generate`` call
  here (a fresh one by default), while dInfer's scripts reuse one decoder for every prompt, so its
  credit survives a call that stopped early on EOS (module docstring of ``dllm/samplers/credit.py``);
* ``forbid_mask_commit=True`` raises :class:`~.llada_generate.MaskCommitError` where the mask id decides
  something at a masked position (the credit's top-1 or the proposal is the mask id), which ``dllm``
  replaces by the runner-up; ``forbid_ties=True`` raises :class:`~.llada_generate.AmbiguousTieError`
  where a commit rests on the 1e-5 band (a candidate below ``threshold`` within 1e-5 of the block's
  most confident one, committed beside it) or the float32 confidence and its float64 value fall on
  different sides of ``threshold``. Neither changes a result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from . import hierarchy_generate as loops
from .hierarchy_generate import add_gumbel_noise
from .llada_generate import AmbiguousTieError, MaskCommitError

__all__ = ["CreditDecoder", "StalledError", "credit_generate", "credit_generate_bd", "threshold_transfer_index"]

BAND = 1e-5  # get_transfer_index_threshold: the most confident minus 1e-5


class StalledError(RuntimeError):
    """A block decoded ``max_decodes`` times without finishing: where dInfer's loop does not end."""


def threshold_transfer_index(logits: torch.Tensor, temperature: float, mask_index: torch.Tensor, x: torch.Tensor,
                             mask_id: int, threshold: float,
                             use_float64: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``get_transfer_index_threshold`` (``rm_mask=True``): logits [B, W, V], mask_index, x [B, W] ->
    (x0 [B, W], transfer [B, W] bool, confidence [B, W] with -inf off the candidates)."""
    x0 = torch.argmax(add_gumbel_noise(logits, temperature), dim=-1)  # [B, W]
    p = F.softmax(logits.to(torch.float64 if use_float64 else torch.float32), dim=-1)  # [B, W, V]
    x0_p = p.gather(-1, x0.unsqueeze(-1)).squeeze(-1)  # [B, W]
    candidates = mask_index & (x0 != mask_id)  # the mask id is never committed
    x0 = torch.where(candidates, x0, x)
    confidence = torch.where(candidates, x0_p, torch.tensor(float("-inf"), dtype=x0_p.dtype))  # [B, W]
    bar = (confidence.max(dim=1).values - BAND).clamp(-1000, threshold).unsqueeze(-1)  # [B, 1]
    return x0, confidence >= bar, confidence


@dataclass
class CreditDecoder:
    """``CreditThresholdParallelDecoder(temperature, threshold)`` with its defaults (alpha 0.7, gamma 0.2,
    beta 0.8) and its state: the credit matrices and call counts per ``(start, end)`` key."""

    temperature: float = 0.0
    threshold: float = 0.9
    credit_alpha: float = 0.7
    boost_gamma: float = 0.2
    decay_beta: float = 0.8
    use_float64: bool = False
    forbid_ties: bool = False
    max_decodes: int = 1000  # per block: dInfer has no cap (module docstring)
    mats: dict = field(default_factory=dict)
    iters: dict = field(default_factory=dict)
    confidence: Optional[torch.Tensor] = None  # the last decode's [B, W] (-inf off its candidates), for tests

    def fuse(self, logits: torch.Tensor, mask_index: torch.Tensor, key: tuple[int, int],
             mask_id: Optional[int] = None) -> torch.Tensor:
        """``_apply_credit_fusion``: logits [B, W, V], mask_index [B, W] -> fused logits [B, W, V] (float32
        for float32 or lower logits). ``mask_id``: raise MaskCommitError where the credit's top-1 is it."""
        if self.iters.get(key, 0) >= self.max_decodes:
            raise StalledError(f"dInfer credit reference: {self.max_decodes} decodes of the block at {key[0]}")
        mat = self.mats.get(key)
        if mat is None or mat.shape != logits.shape or mat.device != logits.device:
            mat = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)  # [B, W, V]
            self.mats[key], self.iters[key] = mat, 0
        if self.iters[key] > 0:
            mat.mul_(self.decay_beta)
        top1_p, top1 = F.softmax(logits.to(torch.float32), dim=-1).max(dim=-1)  # [B, W] each
        if mask_id is not None and bool((mask_index & (top1 == mask_id)).any()):
            raise MaskCommitError(f"dInfer credit reference credits the mask id (block at {key[0]})")
        boost = top1_p.pow(self.boost_gamma).to(mat.dtype) * mask_index.to(mat.dtype)  # [B, W]
        mat.scatter_add_(2, top1.unsqueeze(-1), boost.unsqueeze(-1))
        self.iters[key] += 1
        return logits + self.credit_alpha * torch.log(mat + 1)

    def decode(self, logits: torch.Tensor, x: torch.Tensor, start: int, end: int, mask_id: int,
               forbid_mask_commit: bool = False) -> bool:
        """``decode(logits, start, end, x)`` on canvas x [B, L] (in place); logits [B, end - start, V].
        Returns whether the block had a mask."""
        block = x[:, start:end]  # a view: commits land in x
        mask_index = block == mask_id  # [B, W]
        assert mask_index.shape[1] == logits.shape[1]
        fused = self.fuse(logits, mask_index, (start, end), mask_id if forbid_mask_commit else None)
        x0, transfer, confidence = threshold_transfer_index(fused, self.temperature, mask_index, block, mask_id,
                                                            self.threshold, self.use_float64)
        self.confidence = confidence
        if forbid_mask_commit and bool((mask_index & (x0 == mask_id)).any()):
            raise MaskCommitError(f"dInfer credit reference proposes the mask id (block at {start})")
        if self.forbid_ties:
            _check_ties(fused, confidence, transfer, x0, self.threshold)
        transfer = transfer & mask_index
        block.copy_(torch.where(transfer, x0, block))
        if not bool((x == mask_id).any()):  # the canvas is complete: the credit is dropped
            self.mats.clear()
            self.iters.clear()
        return bool(mask_index.any())


def _check_ties(fused: torch.Tensor, confidence: torch.Tensor, transfer: torch.Tensor, x0: torch.Tensor,
                threshold: float) -> None:
    """``forbid_ties``: raise where the 1e-5 band or float32 rounding decides (module docstring).
    fused [B, W, V]; confidence, transfer, x0 [B, W]."""
    candidates = confidence > float("-inf")  # [B, W]
    best = torch.where(candidates, confidence, float("-inf")).argmax(dim=-1, keepdim=True)  # [B, 1]
    top1 = torch.zeros_like(transfer).scatter_(-1, best, True) & candidates  # [B, W]
    if bool((transfer & candidates & ~top1 & (confidence < threshold)).any()):
        raise AmbiguousTieError("dInfer credit reference: the 1e-5 band commits a second position")
    c64 = torch.softmax(fused.to(torch.float64), dim=-1).gather(-1, x0.unsqueeze(-1)).squeeze(-1)  # [B, W]
    if bool((candidates & ((confidence >= threshold) != (c64 >= threshold))).any()):
        raise AmbiguousTieError("dInfer credit reference: float32 rounding decides a threshold test")


def credit_generate(model, prompt: torch.Tensor, *, gen_length: int, block_length: int, mask_id: int, eos_id: int,
                    decoder: Optional[CreditDecoder] = None, **loop) -> tuple[torch.Tensor, int, int]:
    """``BlockWiseDiffusionLLM(model, CreditThresholdParallelDecoder(...), ...).generate(prompt, gen_length,
    block_length)``: :func:`.hierarchy_generate.hierarchy_generate`'s loop (``cache``, ``early_stop``,
    ``maximum_unroll``, ``expected_tpf``, ``use_shift``, ``forbid_mask_commit`` as there) with ``decoder``
    (a fresh :class:`CreditDecoder` by default). Returns (canvas [1, Lp + G], dInfer's forward count, the
    forwards that found a mask in their block)."""
    rule = CreditDecoder() if decoder is None else decoder
    return loops.hierarchy_generate(model, prompt, gen_length=gen_length, block_length=block_length,
                                    mask_id=mask_id, eos_id=eos_id, rule=rule, **loop)


def credit_generate_bd(model, prompt: torch.Tensor, *, gen_length: int, block_length: int, mask_id: int,
                       eos_id: int, decoder: Optional[CreditDecoder] = None, **loop) -> tuple[torch.Tensor, int, int]:
    """``BlockDiffusionLLMAttnmask(model, CreditThresholdParallelDecoder(...), ...).generate(...)``:
    :func:`.hierarchy_generate.hierarchy_generate_bd`'s block-diffusion loop with ``decoder``."""
    rule = CreditDecoder() if decoder is None else decoder
    return loops.hierarchy_generate_bd(model, prompt, gen_length=gen_length, block_length=block_length,
                                       mask_id=mask_id, eos_id=eos_id, rule=rule, **loop)
