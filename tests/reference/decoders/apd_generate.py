"""Reference transcription of APD's decoding loop (danielmisrael/apd, ``dream/generation_utils.py``,
``DreamGenerationMixin.apd_sample`` with ``sample_with_gumbel``, ``add_gumbel_noise`` and
``apd_accept_criterion``), restated from the public code for ``dllm``'s tests; no code copied.

Kept as the reference runs it (batch 1): the first masked column is the decoding position; each
iteration forwards the diffusion model on ``x[:, :right]`` (``right`` = position + M, or the end),
shifts its logits one column right (Dream), takes the logits of every mask in that window, draws
the drafts with ``sample_with_gumbel`` (logits / T, then ``exp(float64) / (-log u)^T`` with
``u = rand_like``; arg-max at T = 0); the verifier (a ``transformers`` causal LM) prefills the
drafted canvas once and then reads only each iteration's drafts through its KV cache, cropped to
the accepted prefix, its logits shifted with the last iteration's logits at the accepted length;
the target ``w * l_D + (1 - w) * l_AR`` is taken by arg-max (the reference calls
``sample_with_gumbel`` at its default temperature 0, so the noise is not used), the first draft
always accepted and the rest while they match (``cumprod``); the accepted drafts are written and
the loop stops once no mask is left or an EOS is anywhere in the canvas.

Differences, inert for what is tested: the diffusion model is a ``dllm`` Dream-family model called
on raw ids (the same forward as Dream's modelling, tested elsewhere), whose logits already come
shifted (row i predicts position i: the reference's ``cat([logits[:, :1], logits[:, :-1]])``
applied), without the reference's
diffusion KV window (``kv_window`` None); the vocabulary restriction ``[:, :151936]`` (Qwen's) is
written as the first ``min(V_D, V_AR)`` ids of both models; uniforms come from ``generator``
instead of the global one.
"""

from __future__ import annotations

from typing import Optional

import torch


def _drafts(mask_logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
    if temperature == 0:
        return mask_logits.argmax(dim=-1)
    scaled = (mask_logits / temperature).to(torch.float64)
    u = torch.rand(scaled.shape, dtype=torch.float64, generator=generator)
    return (scaled.exp() / (-torch.log(u)) ** temperature).argmax(dim=-1)


def _cache_keyword() -> str:
    """transformers >= 5.?: ``cache=``; before: ``past_key_values=`` (the reference's)."""
    import inspect

    from transformers import Qwen3ForCausalLM

    return "cache" if "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters else "past_key_values"


_CACHE = _cache_keyword()


def _crop(past, keep: int) -> None:
    """``DynamicCache.crop(keep)`` (the reference's absolute length); newer transformers take the
    number of entries to drop, negated."""
    drop = past.get_seq_length() - keep
    if drop > 0:
        past.crop(-drop)


@torch.no_grad()
def apd_generate(model, verifier, prompt: list[int], gen_length: int, *, mixture: float, mask_id: int,
                 eos_id: int, temperature: float = 0.0, lookahead: Optional[int] = None,
                 generator: Optional[torch.Generator] = None) -> tuple[list[int], int]:
    """The generated ids (``gen_length`` of them, masks left where the loop stopped) and the number
    of diffusion forwards."""
    from transformers import DynamicCache

    x = torch.tensor([list(prompt) + [mask_id] * gen_length])
    curr = len(prompt)
    past = DynamicCache()
    prefilling, prev, forwards = True, None, 0
    while curr < x.shape[1]:
        right = x.shape[1] if lookahead is None else min(curr + lookahead, x.shape[1])
        window = x[:, :right]
        logits = model(window).logits  # [1, right, V_D], already Dream's shifted logits (see the docstring)
        forwards += 1
        mask_logits = logits[window == mask_id]  # [N, V_D]: the masks of [curr, right)
        x0 = _drafts(mask_logits, temperature, generator)  # [N]
        if prefilling:
            draft = window.clone()
            draft[:, curr:right] = x0
            out = verifier(draft, **{_CACHE: past}, use_cache=True)
            v_logits = out.logits[:, curr - 1:-1]
        else:
            draft = x0[None]
            positions = torch.arange(curr, right)[None]
            out = verifier(draft, **{_CACHE: past}, use_cache=True, position_ids=positions,
                           cache_position=positions[0])
            v_logits = torch.cat([prev, out.logits[:, :-1]], dim=1)
        if lookahead is not None:
            v_logits = v_logits[:, :lookahead]
        prefilling = False
        v = min(mask_logits.shape[-1], v_logits.shape[-1])
        target = mixture * mask_logits[None, :, :v] + (1 - mixture) * v_logits[..., :v]
        accept = (x0[None] == target.argmax(dim=-1))
        accept[:, 0] = True
        n = int(torch.cumprod(accept.long(), dim=-1).sum())
        n = min(n, x0.shape[-1])
        prev = v_logits[:, n][:, None] if n < v_logits.shape[1] else v_logits[:, -1][:, None]
        _crop(past, curr + n)
        x[0, curr:curr + n] = x0[:n]
        curr += n
        if not (x == mask_id).any() or (x == eos_id).any():
            break
    return x[0, len(prompt):].tolist(), forwards


__all__ = ["apd_generate"]
