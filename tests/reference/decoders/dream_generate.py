"""Reference transcription of Dream's ``diffusion_generate`` (``generation_utils.py``).

Restated from the public Dream generation utilities (HF hub ``Dream-org/Dream-v0-*``; identical
copy in NVlabs/Fast-dLLM ``dream/model/generation_utils.py``).  Only ``_sample`` and
``sample_tokens`` are transcribed (no generation-config plumbing, no hooks, no history, no
``num_return_sequences``; Fast-dLLM's ``confidence_threshold`` is in
:mod:`.fastdllm_dream_generate`).  This is an *oracle*: dtypes,
in-place writes and the order/shape of random draws are kept as in the original.

Differences from the original, all inert for what is tested:

* the model is ``model_fn(x, attention_mask, tok_idx) -> RAW logits [B, N, V]`` (unshifted; the
  shift is applied here, right after the forward, as in ``_sample``).  ``attention_mask`` is the
  4-D boolean mask [B, 1, N, N] (True = may attend) or ``None`` where the original passes the
  string ``"full"``; ``tok_idx`` is ``None`` in the latter case;
* ``max_new_tokens`` must be given (``max_length = Lp + max_new_tokens``);
* ``forbid_mask_commit=True`` raises :class:`~.llada_generate.MaskCommitError` when a token about
  to be written is the mask id (the original would leave / put a mask there);
* ``forbid_ties=True`` raises :class:`~.llada_generate.AmbiguousTieError` when the ``torch.topk``
  choice of positions (confidence algorithms, ``alg_temp`` unset) is decided by tie order.
  Neither flag ever changes a result; they only raise.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributions as dists
import torch.nn.functional as F

from .llada_generate import AmbiguousTieError, MaskCommitError, ambiguous_topk

__all__ = ["dream_generate", "dream_sample_tokens", "dream_top_k_logits", "dream_top_p_logits"]

ModelFn = Callable[[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]], torch.Tensor]


def dream_top_p_logits(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest prefix (by descending logit) whose mass reaches ``top_p``."""
    sorted_logits, sorted_idx = torch.sort(logits, descending=True)
    cum_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    drop_sorted = cum_probs > top_p
    # shift right by one: the entry that crosses the threshold is kept, the first always is.
    drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()
    drop_sorted[..., 0] = 0
    drop = torch.zeros_like(logits, dtype=torch.bool, device=logits.device)
    drop = drop.scatter_(-1, sorted_idx, drop_sorted)
    return logits.masked_fill(drop, torch.finfo(logits.dtype).min)


def dream_top_k_logits(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the logits >= the k-th largest (ties at the threshold survive)."""
    top_k = min(top_k, logits.size(-1))
    threshold = torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(logits < threshold, torch.finfo(logits.dtype).min)


def dream_sample_tokens(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    margin_confidence: bool = False,
    neg_entropy: bool = False,
):
    """Dream ``sample_tokens``: returns ``(confidence [n], tokens [n])`` for logits [n, V].

    At ``temperature > 0`` the token is drawn by ``Categorical(probs).sample()``, i.e. one
    ``torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, replacement=True)`` over all n
    rows on the default generator (nothing is drawn when n == 0).  If that raises (e.g. argument
    validation of ``Categorical``) the original silently falls back to the argmax; kept here.
    """
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = dream_top_p_logits(logits, top_p)
    if top_k is not None:
        logits = dream_top_k_logits(logits, top_k)
    probs = torch.softmax(logits, dim=-1)

    if temperature > 0:
        try:
            tokens = dists.Categorical(probs=probs).sample()
            confidence = torch.gather(probs, -1, tokens.unsqueeze(-1)).squeeze(-1)
        except Exception:  # the original uses a bare ``except``
            confidence, tokens = probs.max(dim=-1)
    else:
        confidence, tokens = probs.max(dim=-1)

    if margin_confidence:
        ranked, _ = torch.sort(probs, dim=-1, descending=True)
        confidence = ranked[:, 0] - ranked[:, 1]

    if neg_entropy:
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)

    return confidence, tokens


@torch.no_grad()
def dream_generate(
    model_fn: ModelFn,
    input_ids: torch.Tensor,
    attention_mask: Optional[torch.Tensor] = None,
    max_new_tokens: Optional[int] = None,
    steps: int = 512,
    temperature: float = 0.0,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    alg: str = "origin",
    alg_temp: Optional[float] = None,
    eps: float = 1e-3,
    mask_id: int = 151666,
    *,
    forbid_mask_commit: bool = False,
    forbid_ties: bool = False,
) -> torch.Tensor:
    """Run Dream's reference sampler; returns the canvas [B, Lp + max_new_tokens] (prompt included).

    Random draws per step (default generator, in this order):
      * ``origin``: ``torch.rand(#masked_total)`` float32 (always, also at T == 0), then -- at
        T > 0 -- one multinomial (1 sample with replacement) over the rows chosen for transfer;
      * confidence algorithms: at T > 0 one multinomial (1 sample with replacement) over ALL
        masked rows (flattened row-major over the batch); then, when ``alg_temp`` is truthy and
        ``k > 0``, ``torch.multinomial(softmax(C / alg_temp), k)`` without replacement on the
        [B, N] confidence matrix.
    """
    if max_new_tokens is None:
        raise ValueError("max_new_tokens is required")
    max_length = input_ids.shape[1] + max_new_tokens
    device = input_ids.device

    # 1. right-pad with the mask id to the full canvas.
    x = F.pad(input_ids, (0, max_length - input_ids.shape[1]), value=mask_id)

    # 2. attention mask / positions, only when the given mask has at least one zero (2.6).
    if attention_mask is not None and torch.any(attention_mask == 0.0):
        attention_mask = F.pad(attention_mask, (0, max_length - attention_mask.shape[1]), value=1.0)
        tok_idx = attention_mask.long().cumsum(-1) - 1
        tok_idx.masked_fill_(attention_mask == 0, 1)
        attention_mask = torch.logical_and(
            attention_mask.unsqueeze(1).unsqueeze(-2),  # [B, 1, 1, N] keys
            attention_mask.unsqueeze(1).unsqueeze(-1),  # [B, 1, N, 1] queries
        )
    else:
        tok_idx = None
        attention_mask = None  # the original's "full"

    # 3. float32 time grid (its rounding decides some integer counts).
    timesteps = torch.linspace(1, eps, steps + 1, device=device)

    # 5. steps.
    for i in range(steps):
        masked = x == mask_id
        raw = model_fn(x, attention_mask, tok_idx)
        # 2.5: logits[:, p] predicts position p from the hidden state at p - 1.
        logits = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)

        masked_logits = logits[masked]  # rows of all masked positions, row-major over the batch
        t = timesteps[i]
        s = timesteps[i + 1]

        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            new_tokens = torch.zeros_like(x[masked], device=device, dtype=torch.long) + mask_id
            go = torch.rand(*new_tokens.shape, device=device) < p_transfer
            _, new_tokens[go] = dream_sample_tokens(
                masked_logits[go], temperature=temperature, top_p=top_p, top_k=top_k
            )
            if forbid_mask_commit and bool((new_tokens[go] == mask_id).any()):
                raise MaskCommitError(f"Dream reference (origin) would commit the mask id (step {i})")
            x[masked] = new_tokens.clone()
        else:
            if alg == "maskgit_plus":
                confidence, proposal = dream_sample_tokens(
                    masked_logits, temperature=temperature, top_p=top_p, top_k=top_k
                )
            elif alg == "topk_margin":
                confidence, proposal = dream_sample_tokens(
                    masked_logits, temperature=temperature, top_p=top_p, top_k=top_k,
                    margin_confidence=True,
                )
            elif alg == "entropy":
                confidence, proposal = dream_sample_tokens(
                    masked_logits, temperature, top_p=top_p, top_k=top_k, neg_entropy=True
                )
            else:
                raise RuntimeError(f"Unknown alg: {alg}")

            # batch-averaged mask count (a float tensor), truncated by int().
            mean_masked = masked.sum() / masked.shape[0]
            k = int(mean_masked * (1 - s / t)) if i < steps - 1 else int(mean_masked)

            full_conf = torch.full_like(x, -torch.inf, device=device, dtype=logits.dtype)
            full_conf[masked] = confidence
            if k > 0:
                if alg_temp is None or alg_temp == 0:
                    _, chosen = torch.topk(full_conf, k)
                    if forbid_ties and any(
                        ambiguous_topk(full_conf[row], chosen[row]) for row in range(x.size(0))
                    ):
                        raise AmbiguousTieError(f"Dream reference ({alg}): tie at the top-k cut (step {i})")
                else:
                    full_conf = full_conf / alg_temp
                    full_conf = F.softmax(full_conf, dim=-1)
                    chosen = torch.multinomial(full_conf, num_samples=k)
                candidates = torch.zeros_like(x, device=device, dtype=torch.long) + mask_id
                candidates[masked] = proposal.clone()
                rows = torch.arange(x.size(0), device=device).unsqueeze(1).expand_as(chosen)
                if forbid_mask_commit and bool((candidates[rows, chosen] == mask_id).any()):
                    raise MaskCommitError(
                        f"Dream reference ({alg}) would write the mask id (step {i})"
                    )
                x[rows, chosen] = candidates[rows, chosen]

    return x
