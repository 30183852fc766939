"""``sdar``: SDAR's block-diffusion decoding step (JetAstra/SDAR ``generate.py``
``block_diffusion_generate``; SDAR, arXiv 2510.06303), for block-causal models.

Per block the official loop runs up to ``denoising_steps`` steps over the model's grid
block (the prompt's last ``n % bs`` tokens included in the first one). A step:

1. proposes ``x0`` for every row of the grid block and its probability ``p(x0)``: at T > 0 by
   ``multinomial`` sampling from ``softmax(logits / T)`` (the division skipped at T = 1, as there),
   after optional top-k / top-p filtering (``top_k_logits``, ``top_p_logits``), over the grid
   block's ``bs`` rows (prompt-tail rows included, so the random stream is the official one); at
   T = 0 (a dllm addition: the official loop always samples) the arg-max and its softmax probability;
2. takes ``n_step = get_num_transfer_tokens(bs, denoising_steps)[step]`` (``bs // denoising_steps``,
   the first ``bs % denoising_steps`` steps one more) and commits, by ``strategy``:

   - ``low_confidence_dynamic`` (official default): every mask with ``p(x0) > threshold`` if there
     are at least ``n_step`` of them, else the ``n_step`` most confident (``torch.topk``);
   - ``low_confidence_static``: the ``n_step`` most confident masks;
   - ``sequential``: ``n_step`` masks from the first mask on.

The engine then loops until the block has no mask; ``dllm.generate(..., stop_at_eos=True)`` stops
after the first block that holds an EOS/EoT, as the official ``stopping_criteria_idx`` test does.
With ``cache="block"`` the finished blocks' keys/values are reused exactly, as the official
``store_kv`` cache does (one forward fewer per block: ``dllm.cache.block_causal``).

Differences from the original, on purpose:

- the ``topk`` of the official ``low_confidence_*`` rules runs over the whole grid block with -inf
  off the masks, so when fewer masks remain than ``n_step`` it also selects non-mask positions and
  overwrites them with their fresh samples: committed tokens, or the prompt tail in the first block.
  dllm commits masks only. The two agree whenever ``denoising_steps == bs`` (one token per step, the released
  setting) and whenever the masks left never fall below the step's quota;
  tests/samplers/test_sdar_generate.py compares both token for token and counts where they differ;
- ``entropy_bounded`` is not offered: the official branch reads ``transfer_index`` before assigning
  it (a NameError) and sums entropies of the sampled probabilities over the block;
- on a bidirectional model (LLaDA, Dream) the same rule runs inside the call's blocks
  (``block_length``), which start at the generated region, with quotas from ``block_length``;
- the last block may be shorter than ``bs`` (``gen_length`` not reaching a grid boundary); the
  official loop extends the canvas with masks to the boundary instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from dllm.schedule import BLOCK_SIZE_KEY, grid_start
from dllm.options import check_choice, check_int, check_unit
from dllm.samplers import draws
from dllm.samplers._ops import expand_window, window_of
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import argmax_excluding, column_ids, neg_inf
from dllm.state import DecodeState, StepInput, StepOutput

STRATEGIES = ("low_confidence_dynamic", "low_confidence_static", "sequential")


@dataclass(frozen=True)
class SDARConfig:
    denoising_steps: int = 4  # steps per block (generate.py --denoising_steps), at most the block size
    strategy: str = "low_confidence_dynamic"  # generate.py --remasking_strategy
    threshold: float = 0.85  # low_confidence_dynamic: commit every mask with p(x0) > threshold
    top_k: int = 0  # sampling at T > 0: keep the k largest logits (0: off; the vocabulary size or more: all)
    top_p: float = 1.0  # sampling at T > 0: nucleus mass (1.0: off)

    def __post_init__(self) -> None:
        check_int("denoising_steps", self.denoising_steps, 1)
        check_choice("strategy", self.strategy, STRATEGIES)
        check_unit("threshold", self.threshold)
        check_int("top_k", self.top_k, 0)
        check_unit("top_p", self.top_p, low_open=True)


def transfer_counts(block: int, steps: int) -> list[int]:
    """generate.py ``get_num_transfer_tokens``: ``block // steps`` per step, the first ``block % steps``
    steps one more (4 / 4 -> 1, 1, 1, 1; 8 / 3 -> 3, 3, 2)."""
    base, rem = divmod(block, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[N, V]: logits below the k-th largest of their row -> -inf (ties at the k-th kept). A ``k`` of
    the vocabulary size or more keeps every logit (the official ``torch.topk`` would raise)."""
    kth = torch.topk(logits, min(k, logits.shape[-1])).values[..., -1, None]
    return torch.where(logits < kth, torch.full_like(logits, float("-inf")), logits)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """[N, V]: keep the smallest prefix of the descending order whose softmax mass passes ``p`` (the
    token that crosses it included); the rest -> -inf."""
    sorted_logits, order = torch.sort(logits, descending=True)
    cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    drop = cum > p
    drop[..., 1:] = drop[..., :-1].clone()
    drop[..., 0] = False
    mask = torch.scatter(torch.zeros_like(logits, dtype=torch.bool), -1, order, drop)
    return logits.masked_fill(mask, float("-inf"))


def propose(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
            generator: draws.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, W, V] -> (x0 [B, W] long, p(x0) [B, W]) as generate.py's
    ``sample_with_temperature_topk_topp`` (T > 0: one ``multinomial`` over the B*W rows), or the
    arg-max and its softmax probability at T = 0."""
    if temperature == 0:  # a softmax and a max treat each row alone: the same bits as over [B*W, V]
        probs, x0 = F.softmax(logits, dim=-1).max(dim=-1)  # [B, W], [B, W]
        return x0, probs
    b, w, v = logits.shape
    flat = logits.reshape(-1, v)  # [B*W, V]
    if temperature != 1.0:
        flat = flat / temperature
    if top_k > 0:
        flat = top_k_filter(flat, top_k)
    if top_p < 1.0:
        flat = top_p_filter(flat, top_p)
    probs = F.softmax(flat, dim=-1)
    x0 = draws.multinomial(probs, 1, generator)  # [B*W, 1] (per-row generators: W rows each)
    return x0.view(b, w), torch.gather(probs, -1, x0).view(b, w)


def never_mask(x0: torch.Tensor, logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """x0 [B, W] with every drawn mask token replaced by the best other token of its row (logits
    [B, W, V]). The official loop can draw the mask token itself (sampled at T > 0, or as the arg-max
    at T = 0) and "commit" it: the position stays masked and a later step decides it, which the engine
    reproduces as is; but at the block's last step it would leave the block unfinished (the official
    canvas keeps a mask there, and after such a step its last quota is short of the masks left), so
    that step commits every mask left with this. Runs whose blocks end without a mask stay
    token-equal to the official loop."""
    return torch.where(x0 == mask_id, argmax_excluding(logits, mask_id), x0)


def choose(conf: torch.Tensor, masks: torch.Tensor, n: int, strategy: str, threshold: float) -> torch.Tensor:
    """conf [B, W] p(x0), masks [B, W] bool, this step's quota n -> [B, W] bool, masks to commit."""
    w = conf.shape[1]
    k = min(n, w)
    if strategy == "sequential":
        idx = column_ids(w, conf.device)  # [W]
        first = torch.where(masks, idx, w).min(dim=1, keepdim=True).values  # [B, 1]
        return masks & (idx >= first) & (idx < first + n)
    score = torch.where(masks, conf, neg_inf(conf.device))  # [B, W]
    top = torch.zeros_like(masks)
    if k > 0:
        top.scatter_(1, torch.topk(score, k, dim=-1).indices, True)
    if strategy == "low_confidence_static":
        return top & masks
    high = score > threshold  # [B, W]
    use_high = high.sum(dim=1, keepdim=True) >= n  # [B, 1]
    return torch.where(use_high, high, top) & masks


def block_of(state: DecodeState) -> int:
    """The block whose quotas a step follows: the block-causal model's trained block, else the call's
    nominal ``block_length`` (a bidirectional model then runs SDAR's rule inside LLaDA-style blocks)."""
    return int(state.extras.get(BLOCK_SIZE_KEY) or state.block_length)


@register_sampler("sdar")
class SDARSampler(Sampler):
    """SDAR generate.py: per grid block, up to denoising_steps steps of threshold / top-k unmasking."""

    Config = SDARConfig
    fixed_steps = False

    @property
    def commits_every_step(self) -> bool:
        return True  # every remasking rule takes at least one mask (a quota >= 1, or the first mask)

    def block_refusal(self, block_size: int) -> Optional[tuple[str, str]]:
        if self.config.denoising_steps <= block_size:
            return None
        return "denoising_steps", (f"sampler 'sdar': denoising_steps={self.config.denoising_steps} exceeds the block "
                                   f"size {block_size}; a step must be able to commit a token (valid: 1 .. {block_size})")

    def begin_block(self, state: DecodeState) -> None:
        refusal = self.block_refusal(block_of(state))
        if refusal is not None:
            raise ValueError(refusal[1])

    def max_block_steps(self, block_len: int) -> int:
        return self.config.denoising_steps

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        s, e = state.block_start, state.block_end
        # block-causal: the grid block [g, e) holds the prompt tail in the first block; else the block
        g = grid_start(state, s) if BLOCK_SIZE_KEY in state.extras else s
        a, b = g - inp.query_start, e - inp.query_start  # its rows in query coordinates
        if a < 0:
            raise ValueError(f"sampler 'sdar' needs the logits of the whole grid block [{g}, {e}) but the "
                             f"step's query starts at column {inp.query_start}; use cache 'none' or 'block'")
        logits = window_of(inp.logits, (a, b))  # [B, W, V] (the query itself when it is the grid block)
        x0, conf = propose(logits, inp.temperature, cfg.top_k, cfg.top_p, inp.generator)
        last = inp.step >= cfg.denoising_steps - 1
        if last:  # the block's last step: a drawn mask would stay masked
            x0 = never_mask(x0, logits, inp.mask_id)
        masks = window_of(inp.active, (a, b))  # [B, W] the block's masks (the prompt tail is never active)
        if last:  # every mask left: its quota, unless an earlier step "committed" the mask token (below)
            commit = masks
        else:
            quotas = transfer_counts(block_of(state), cfg.denoising_steps)
            commit = choose(conf, masks, quotas[inp.step], cfg.strategy, cfg.threshold)  # [B, W] masks only
        q = inp.tokens.shape[1]  # off the grid block: nothing committed, scores -inf (tokens not read)
        return StepOutput(commit=expand_window(commit, (a, b), q, False),
                          tokens=expand_window(x0, (a, b), q, inp.mask_id),
                          score=expand_window(conf, (a, b), q, float("-inf")), active_only=True)


__all__ = ["SDARConfig", "SDARSampler", "choose", "never_mask", "propose", "transfer_counts"]
