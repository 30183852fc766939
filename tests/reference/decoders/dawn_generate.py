"""Reference transcription of DAWN's dependency-aware decoder (lizhuo-luo/DAWN at ab42898; arXiv 2602.06953),
restated from the public code for ``dllm``'s tests; no code copied:

* LLaDA: ``llada/generate.py`` ``generate(..., dawn=True)`` (the only driver that dispatches to it; no cache)
  and ``get_transfer_index_dawn``; ``llada/gdllm_utils.py`` ``detect_attn_sinks_`` and
  ``select_parallel_tokens_conflict_mis``. ``generate()``'s defaults: ``tau_sink=0.01, tau_edge=0.07,
  tau_induce=0.7, tau_low=0.7``; ``llada/eval_instruct.sh`` passes ``tau_low=0.75`` (GSM8K, MATH), block 32;
* Dream: ``dream/model/generation_utils.py`` ``_sample_block`` with ``alg='dawn'`` (``conf_threshold`` is
  tau_low); ``dream/eval_instruct.sh`` passes ``tau_sink=0.03, tau_edge=0.10, tau_induce=0.75,
  conf_threshold=0.8``, block 32, greedy.

The attention maps (``llada/model/modeling_llada.py`` and ``dream/model/modeling_dream.py``, ``attn_avg``): in
each of the last 4 layers (LLaDA-8B ``layer_id >= 28`` of 32, Dream-7B ``layer_idx >= 24`` of 28) the
probabilities ``softmax(q k^T / sqrt(d) + mask)`` in the model dtype, averaged over heads ([B, L, L]); then
``torch.stack`` over those layers, in layer order, and the mean over them. :func:`attention_model_fn` builds
that from a ``dllm`` model's per-layer probabilities (``want_attn_layers``, [B, H, L, L] float32).

The loop (both): per block, until the block has no masks, one full forward and one commit (LLaDA tests the
block after the commit, Dream before the forward: the same forwards on a fresh block). One step, batch 1:
``x0_p`` = ``p(x0)`` at every position (LLaDA: ``softmax(float64(logits))``, ``x0`` the arg-max, at T > 0 that of
the float64 Gumbel-perturbed logits; Dream: ``sample_tokens`` on the shifted logits, ``softmax`` in the
logits dtype, ``max``), ``M`` = the masks left of the block's end, then :func:`dawn_transfer`.

This is an *oracle*: dtypes, in-place writes and the greedy loop are as in the original, including its overflow:
``select_parallel_tokens_conflict_mis`` makes as many picks as there were candidates, so once a conflict has
dropped one, the remaining picks are ``argmax`` of an all ``-inf`` row, position 0, and position 0 (the prompt's
first token) is overwritten with the proposal there (LLaDA's ``x0`` there is not reset to ``x``). Differences,
inert for what is tested:

* the model is ``model_fn(x) -> (raw logits [1, L, V], averaged attention [1, L, L])`` (the Dream path applies
  Dream's shift itself); the mask id is a parameter; ``remasking='random'``, hooks, history, timing omitted;
* at T > 0 (LLaDA only) the float64 uniforms of the Gumbel-max are drawn over the whole canvas as in the
  original, [1, L, V] on ``generator``;
* ``forbid_mask_commit=True`` raises :class:`~.llada_generate.MaskCommitError` where a committed proposal is the
  mask id, or where a decoded position left of the block's end is an anchor by the probability of the mask id
  (its arg-max there, ``x0_p >= 0.9``; ``dllm`` never proposes the mask id, and the runner-up's probability is
  then below 0.5: never an anchor);
* ``forbid_prompt_write=True`` raises :class:`PromptWriteError` where the overflow above would change position 0;
* ``overflow=False`` (not the original) stops the greedy loop once no candidate is left: no filler picks.

The ``forbid_*`` flags never change a result; they only raise. The LLaDA Gumbel-max is
:func:`~.localleap_generate.gumbel_noisy`; that module's loop does not fit (its model returns logits only, its
rule is fixed), so the loop is restated here.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .dream_generate import dream_sample_tokens
from .llada_generate import MaskCommitError
from .localleap_generate import gumbel_noisy

__all__ = ["PromptWriteError", "attention_model_fn", "conflict_mis", "dawn_generate", "dawn_transfer"]

ModelFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
TAU_HIGH = 0.9  # hard-coded in both ``get_transfer_index_dawn`` and ``_sample_block``


class PromptWriteError(RuntimeError):
    """DAWN's greedy loop overflowed onto position 0 with another token than the prompt's (``forbid_prompt_write``)."""


def attention_model_fn(model, layers: int = 4) -> ModelFn:
    """A ``dllm`` model as DAWN's modified one: ``x [1, L] -> (raw logits [1, L, V], attention [1, L, L])``, the
    attention being ``attn_avg`` (mean over heads) of each of the last ``layers`` layers, stacked, mean over them."""
    want = tuple(range(-layers, 0))

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions, mask = model._prepare(x, None, None)
        raw, _, attn = model._raw_forward(x, positions, mask, want, ())  # attn {layer: [1, H, L, L]}
        per_layer = [attn[i].mean(dim=1) for i in sorted(attn)]  # [1, L, L] each
        return raw, torch.stack(per_layer).mean(dim=0)

    return fn


def conflict_mis(edge: torch.Tensor, node: torch.Tensor, confidence: torch.Tensor, overflow: bool = True
                 ) -> list[int]:
    """``select_parallel_tokens_conflict_mis`` for one row: edge [L, L] bool, node [L] bool and confidence [L]
    (``-inf`` off ``node``; both written in place, as the original) -> the picks, ``node.sum()`` of them
    (``overflow=False``: none once every candidate is taken or dropped)."""
    k = int(node.sum())
    conflict = edge | edge.T
    picks: list[int] = []
    while len(picks) < k:
        if not overflow and bool(torch.isneginf(confidence).all()):
            break
        best = int(torch.argmax(confidence))  # first maximum; 0 once every entry is -inf
        picks.append(best)
        confidence[best] = float("-inf")
        neighbours = torch.nonzero(conflict[best], as_tuple=True)[0].tolist()
        node[neighbours] = False
        confidence[neighbours] = float("-inf")
    return picks


def dawn_transfer(x0_p: torch.Tensor, mask_index: torch.Tensor, attn: torch.Tensor, block_end: int, *,
                  tau_sink: float, tau_edge: float, tau_induce: float, tau_low: float, overflow: bool = True
                  ) -> torch.Tensor:
    """The selection of ``get_transfer_index_dawn`` (and of ``_sample_block``'s ``dawn`` branch, the same on the
    masks): x0_p [1, L] (float64 or the logits dtype), mask_index [1, L] bool (none right of ``block_end``),
    attn [1, L, L] (query x key) -> transfer [1, L] bool."""
    sink = attn.mean(dim=1) > tau_sink  # [1, L] column means (detect_attn_sinks_)
    attn = attn.masked_fill(sink.unsqueeze(1), 0.0)  # [1, L, L]
    attn.diagonal(dim1=1, dim2=2).zero_()
    depends = (attn >= tau_edge).transpose(1, 2)  # [1, j, i]: i attends to j
    neg_inf = torch.tensor(float("-inf"), dtype=x0_p.dtype)
    confidence = torch.where(mask_index, x0_p, neg_inf)
    high = confidence >= TAU_HIGH  # [1, L]
    decoded = (~mask_index & (x0_p >= TAU_HIGH)).unsqueeze(-1)  # [1, L, 1] anchors j
    decoded[:, block_end:] = False
    dependent = (depends & decoded).any(dim=1) & mask_index  # [1, L]
    induced = torch.where(dependent, x0_p, neg_inf) >= tau_induce
    blocked = (depends & (induced & high).unsqueeze(-1)).any(dim=1)  # [1, L]
    node = mask_index & (x0_p >= tau_low) & ~high & ~induced & ~blocked  # Dream: (x0_p < 0.9), the same on M
    chosen = torch.zeros_like(mask_index)
    if int(node.sum(dim=-1).min()) != 0:
        edge = node.unsqueeze(2) & node.unsqueeze(1) & depends  # [1, L, L]
        picks = conflict_mis(edge[0], node[0], torch.where(node, x0_p, neg_inf)[0], overflow)
        chosen[0, picks] = True
    transfer = induced | high | chosen
    if int(transfer.sum(dim=-1).min()) == 0:
        best = torch.argmax(confidence, dim=1, keepdim=True)  # [1, 1]
        transfer = transfer | torch.zeros_like(transfer).scatter_(1, best, True)
    return transfer


def _llada_step(logits: torch.Tensor, temperature: float,
                generator: Optional[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """(x0 [1, L], x0_p [1, L] float64) at every position; x0 is not reset to x off the masks (as the original)."""
    noisy = gumbel_noisy(logits, temperature, generator)
    x0 = torch.argmax(noisy, dim=-1)  # [1, L]
    p = F.softmax(logits.to(torch.float64), dim=-1)
    return x0, torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)


def _dream_step(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's greedy ``sample_tokens`` on the shifted logits: (x0 [1, L], x0_p [1, L] logits dtype)."""
    logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # [1, L, V] Dream's shift
    conf, x0 = dream_sample_tokens(logits)
    return x0, conf


def _check(x: torch.Tensor, x0: torch.Tensor, x0_p: torch.Tensor, transfer: torch.Tensor, mask_index: torch.Tensor,
           end: int, mask_id: int, forbid_mask_commit: bool, forbid_prompt_write: bool) -> None:
    """The ``forbid_*`` checks of one step (all tensors [1, L])."""
    if forbid_mask_commit:
        anchor = ~mask_index[:, :end] & (x0[:, :end] == mask_id) & (x0_p[:, :end] >= TAU_HIGH)  # [1, end]
        if bool((x0[transfer] == mask_id).any()) or bool(anchor.any()):
            raise MaskCommitError(f"DAWN reference: the mask id is an arg-max it reads (block ending at {end})")
    if forbid_prompt_write and bool(transfer[0, 0]) and int(x0[0, 0]) != int(x[0, 0]):
        raise PromptWriteError(f"DAWN reference: the greedy overflow rewrites position 0 (block ending at {end})")


@torch.no_grad()
def dawn_generate(
    model_fn: ModelFn,
    prompt: torch.Tensor,
    *,
    gen_length: int,
    block_length: int,
    mask_id: int,
    family: str = "llada",
    tau_sink: float = 0.01,
    tau_edge: float = 0.07,
    tau_induce: float = 0.7,
    tau_low: float = 0.7,
    temperature: float = 0.0,
    generator: Optional[torch.Generator] = None,
    forbid_mask_commit: bool = False,
    forbid_prompt_write: bool = False,
    overflow: bool = True,
) -> tuple[torch.Tensor, int]:
    """prompt [1, Lp] -> (canvas [1, Lp + gen_length], forwards). ``family``: ``"llada"`` or ``"dream"``."""
    assert prompt.shape[0] == 1, "batch 1, as the scripts run it"
    assert family in ("llada", "dream") and (family == "llada" or temperature == 0)
    assert gen_length % block_length == 0
    lp = prompt.shape[1]
    x = torch.full((1, lp + gen_length), mask_id, dtype=torch.long)
    x[:, :lp] = prompt
    taus = dict(tau_sink=tau_sink, tau_edge=tau_edge, tau_induce=tau_induce, tau_low=tau_low, overflow=overflow)
    nfe = 0
    for start in range(lp, lp + gen_length, block_length):
        end = start + block_length
        while bool((x[:, start:end] == mask_id).any()):
            mask_index = x == mask_id  # [1, L]
            mask_index[:, end:] = False
            logits, attn = model_fn(x)  # [1, L, V], [1, L, L]
            nfe += 1
            if family == "llada":
                x0, x0_p = _llada_step(logits, temperature, generator)
            else:
                x0, x0_p = _dream_step(logits)
            transfer = dawn_transfer(x0_p, mask_index, attn, end, **taus)  # [1, L]
            _check(x, x0, x0_p, transfer, mask_index, end, mask_id, forbid_mask_commit, forbid_prompt_write)
            x[transfer] = x0[transfer]
    return x, nfe
