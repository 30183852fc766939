"""APD, adaptive parallel decoding (Israel, Van den Broeck & Grover, arXiv 2506.00413; code:
danielmisrael/apd, ``dream/generation_utils.py`` ``apd_sample``).

Left to right, each step drafts every remaining mask of the block from the diffusion model's
marginals and accepts the longest prefix that a small autoregressive *verifier* agrees with:

- proposals ``x0``: the diffusion model's arg-max (T = 0) or its Gumbel-max sample at temperature
  T, ``exp(l / T) / (-log u)^T`` in float64 with one uniform per position and vocabulary entry, as
  the reference draws them;
- the verifier reads the canvas with the drafts in place (one causal forward over the prompt, the
  committed tokens and the drafts) and gives, for each drafted position, its logits given the
  drafts to its left;
- the target is the multiplicative mixture ``p_D^w * p_AR^(1-w)``, i.e. the logits
  ``w * l_D + (1 - w) * l_AR`` (``mixture`` = w; over the vocabulary both models share, the first
  ``min(V_D, V_AR)`` ids); a draft is accepted while it equals the target's arg-max, the first
  one always: the row commits that prefix;
- a row whose accepted prefix holds an EOS (any of the model's ``eos_ids``: its eos and its
  end-of-turn id, as the engine's stop rule) commits its first EOS id on the rest of its block (the
  reference stops there).

``lookahead`` (the reference's M) caps the drafts considered per step (the reference also truncates
the diffusion model's input at the decoding position + M; here the forward reads the query the cache
policy gives, so with a lookahead the tokens may differ from the reference's); ``mixture`` near 1 trusts the
diffusion model (more tokens per step), near 0 the verifier (closer to its greedy decode). The
verifier is recomputed over the whole row every step (the reference keeps its KV cache and crops
it to the accepted prefix: the same logits up to float rounding). Where the reference truncates the
diffusion model's input at ``curr + M`` (and recomputes a KV window ``W``), the engine forwards its
query as the cache policy says (``cache=``): with ``cache="none"`` and no lookahead the two are the
same computation. At T > 0 one host read per step (the rows' draft counts: the shape of the
reference's per-row uniforms); at T = 0 none.

``verifier``: a causal LM object (a ``transformers`` model, or any callable whose output has
``.logits``), or a name that ``dllm.load_target`` knows (default ``tiny-ar-mini``: the embedded AR
model trained on the tiny models' PB-mini suite, ``dllm train --recipe tiny-ar-mini``), loaded once
per process.
Its token ids must be the diffusion model's for the shared vocabulary (the embedded AR models
share the task vocabulary of the embedded tiny models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from dllm.options import SettingError, check_int, check_unit
from dllm.outputs import eos_tensor
from dllm.samplers import draws
from dllm.samplers._ops import gumbel_perturb, window_output
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import argmax_excluding
from dllm.state import DecodeState, StepInput, StepOutput

_LOADED: dict[str, Any] = {}  # verifier name -> model, loaded once per process


def load_verifier(verifier: Any, device: torch.device) -> Any:
    """The verifier model on ``device``: the object itself, or a name loaded once."""
    if not isinstance(verifier, str):
        return verifier
    key = f"{verifier}@{device}"
    if key not in _LOADED:
        from dllm.models.targets import load_target

        model, _ = load_target(verifier, device=str(device))
        _LOADED[key] = model.eval()
    return _LOADED[key]


def draft_rank(active: torch.Tensor) -> torch.Tensor:
    """Each active position's index among its row's active positions (0 for the leftmost). [B, W]."""
    return active.long().cumsum(dim=1) - 1


def accepted_prefix(match: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """The leftmost run of matching drafts, the first draft always accepted (APD's
    ``accept[:, 0] = 1; cumprod``). match, active: [B, W] bool -> [B, W] bool within ``active``."""
    first = active & (draft_rank(active) == 0)
    ok = match | first | ~active  # committed positions left of the drafts do not break the run
    return torch.cumprod(ok.long(), dim=1).bool() & active


def mixture_argmax(diffusion_logits: torch.Tensor, verifier_logits: torch.Tensor, weight: float) -> torch.Tensor:
    """arg-max of ``w * l_D + (1 - w) * l_AR`` over the shared vocabulary. [B, W, V_*] x2 -> [B, W]."""
    v = min(diffusion_logits.shape[-1], verifier_logits.shape[-1])
    target = weight * diffusion_logits[..., :v] + (1 - weight) * verifier_logits[..., :v]
    return target.argmax(dim=-1)


@dataclass(frozen=True)
class APDConfig:
    verifier: Any = "tiny-ar-mini"  # a causal LM, or a name dllm.load_target knows
    mixture: float = 0.7  # w: the diffusion model's weight in the multiplicative mixture
    lookahead: Optional[int] = None  # M: at most this many drafts per step (None: the whole block)

    def __post_init__(self) -> None:
        named = isinstance(self.verifier, str)
        if (named and not self.verifier) or (not named and not callable(self.verifier)):  # a name, or a model
            raise SettingError("verifier", f"verifier must be a causal LM or the name of one (e.g. 'tiny-ar'), got "
                                           f"{self.verifier!r}")
        check_unit("mixture", self.mixture)
        if self.lookahead is not None:
            check_int("lookahead", self.lookahead, 1, hint=" (or None: the whole block)")


@register_sampler("apd")
class APD(Sampler):
    """APD: drafts from the diffusion marginals, the prefix a small AR verifier's mixture agrees with."""

    Config = APDConfig
    fixed_steps = False
    reads_block_only = True
    loads = ("verifier",)

    def prepare(self, device: torch.device) -> None:
        load_verifier(self.config.verifier, device)  # loaded once a process (a name), before any clock

    @property
    def commits_every_step(self) -> bool:
        return True  # the first draft of every row with masks is always accepted

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        ws, we = inp.window
        logits = inp.logits[:, ws:we]  # [B, W, V_D]
        active = inp.active[:, ws:we]  # [B, W]
        if cfg.lookahead is not None:
            active = active & (draft_rank(active) < cfg.lookahead)
        x0 = self._propose(logits, active, inp)  # [B, W]
        b0 = inp.query_start + ws  # canvas column of the window's first position
        draft = state.x[:, :b0 + (we - ws)].clone()  # [B, R]: prompt, committed tokens, drafts
        window = draft[:, b0:]
        window.copy_(torch.where(active, x0, window))
        verifier = load_verifier(cfg.verifier, logits.device)
        v_ar = int(verifier.get_input_embeddings().num_embeddings) if hasattr(verifier, "get_input_embeddings") else None
        if v_ar is not None:  # ids the verifier cannot read (never a match: the target is over shared ids)
            draft = draft.masked_fill(draft >= v_ar, 0)
        out = verifier(draft, attention_mask=state.key_padding_mask[:, :draft.shape[1]].long(),
                       position_ids=state.positions[:, :draft.shape[1]])
        verifier_logits = out.logits[:, b0 - 1:draft.shape[1] - 1]  # [B, W, V_AR]: position c read at c - 1
        match = x0 == mixture_argmax(logits, verifier_logits, cfg.mixture)
        accept = accepted_prefix(match, active)  # [B, W]
        tokens = torch.where(accept, x0, torch.full_like(x0, inp.mask_id))
        commit = accept
        eos_ids = state.extras.get("eos_ids", ())
        if eos_ids:  # a row that accepted any of its EOS/EoT ids is done: the first EOS on the rest of its block
            done = (accept & torch.isin(x0, eos_tensor(state))).any(dim=1, keepdim=True)  # [B, 1] (the call's
            #   EOS ids on the device, made once per call: no upload per step)
            rest = inp.active[:, ws:we] & ~accept & done
            tokens = torch.where(rest, torch.full_like(x0, eos_ids[0]), tokens)
            commit = accept | rest
        return window_output(inp, commit, tokens, None)

    def _propose(self, logits: torch.Tensor, active: torch.Tensor, inp: StepInput) -> torch.Tensor:
        """The drafts: arg-max at T = 0, else the reference's float64 Gumbel-max draw with uniforms
        for the drafted positions only, row by row (``[n_r, V]`` each, as the reference draws them)."""
        t = inp.temperature
        if t == 0:
            return argmax_excluding(logits, inp.mask_id)
        counts = active.sum(dim=1).tolist()  # the step's host read
        v = logits.shape[-1]
        flat = draws.rand_segments([n * v for n in counts], inp.generator, logits.device, torch.float64)
        u = torch.full(active.shape + (v,), 0.5, dtype=torch.float64, device=logits.device)
        # the drafted positions in row-major order (the stable sort puts them first), each row's drafts in
        # order; their number is known here, so no boolean-mask write (a nonzero, read back on CUDA)
        at = (~active).flatten().to(torch.int8).argsort(stable=True)[:sum(counts)]  # [n]
        u.view(-1, v).index_copy_(0, at, flat.view(-1, v))
        return argmax_excluding(gumbel_perturb(logits / t, t, u), inp.mask_id)  # the reference scales first


__all__ = ["APD", "APDConfig", "accepted_prefix", "draft_rank", "load_verifier", "mixture_argmax"]
