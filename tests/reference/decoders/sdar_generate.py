"""Reference transcription of SDAR's decoding loop (JetAstra/SDAR ``generate.py``:
``block_diffusion_generate``, ``get_num_transfer_tokens``, ``sample_with_temperature_topk_topp``,
``top_k_logits``, ``top_p_logits``), restated from the public code for ``dllm``'s tests; no code
copied. The model is ``tests/reference/modelling/sdar_modeling.RefSDARForCausalLM`` (the official forward with
its ``store_kv`` cache).

Kept as in the original: the canvas padded with masks to a whole number of blocks of the grid that
starts at position 0; the block-causal mask ``tril(ones(nb, nb))`` repeated per block, sliced per
forward ([1, T, K], float ones/zeros); the prefill of the prompt's complete blocks with
``store_kv=True``; per block, up to ``denoising_steps + 1`` iterations: when the block has no mask,
one more forward with ``store_kv=True`` stores its K/V and ends the block, else a forward with
``store_kv=False`` over the grid block (prompt tail included), sampling over all its rows (one
``torch.multinomial`` on the global generator), and the three remasking rules with their
``torch.topk`` over the whole block (-inf off the masks), including its selection of non-mask
positions when fewer masks remain than the step's quota; after each block the stop test ``any
stop id in x[:, prompt_length:]``.

Differences, inert for what is tested:

* ``entropy_bounded`` is omitted (its official branch reads ``transfer_index`` before assigning it);
* ``overwrites`` (optional list) records ``(block, step, n)`` whenever a step's transfer set holds
  ``n`` > 0 non-mask positions (the rewrite of committed or prompt tokens), so tests can tell the
  runs where dllm, which commits masks only, must differ;
* batch 1, as the original's CLI (``transfer_index`` is built per row there too).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..modelling.sdar_modeling import RefCache


def ref_top_k_logits(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0:
        return logits
    values, _ = torch.topk(logits, k)
    min_values = values[..., -1, None]
    return torch.where(logits < min_values, torch.full_like(logits, float("-inf")), logits)


def ref_top_p_logits(logits: torch.Tensor, p: float) -> torch.Tensor:
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_mask = cumulative > p
    sorted_mask[..., 1:] = sorted_mask[..., :-1].clone()
    sorted_mask[..., 0] = False
    mask_indices = torch.scatter(torch.full_like(logits, False, dtype=torch.bool), -1, sorted_indices, sorted_mask)
    return logits.masked_fill(mask_indices, float("-inf"))


def ref_sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
    shape = logits.shape[:-1]
    logits = logits.reshape(-1, logits.shape[-1])
    if temperature != 1.0:
        logits = logits / temperature
    if top_k > 0:
        logits = ref_top_k_logits(logits, top_k)
    if top_p < 1.0:
        logits = ref_top_p_logits(logits, top_p)
    probs = F.softmax(logits, dim=-1)
    token = torch.multinomial(probs, num_samples=1)
    token_prob = torch.gather(probs, -1, token)
    return token.view(*shape), token_prob.view(*shape)


def ref_num_transfer_tokens(block_length: int, steps: int) -> torch.Tensor:
    base, remainder = block_length // steps, block_length % steps
    n = torch.zeros(steps, dtype=torch.int64) + base
    n[:remainder] += 1
    return n


@torch.no_grad()
def sdar_generate(model, input_ids: torch.Tensor, mask_id: int, gen_length: int = 128, block_length: int = 8,
                  denoising_steps: int = 8, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  remasking_strategy: str = "low_confidence_dynamic", confidence_threshold: float = 0.85,
                  stopping_criteria_idx: Optional[Sequence[int]] = None,
                  overwrites: Optional[list] = None, counts: Optional[dict] = None) -> torch.Tensor:
    """Returns the canvas [1, total_length] (prompt, decoded blocks, masks after a stop)."""
    prompt_length = input_ids.shape[1]
    cache = RefCache()
    num_blocks = (prompt_length + gen_length + block_length - 1) // block_length
    total_length = num_blocks * block_length
    block_mask = torch.tril(torch.ones(num_blocks, num_blocks))
    full_mask = block_mask.repeat_interleave(block_length, dim=0).repeat_interleave(block_length, dim=1).unsqueeze(0)
    position_ids = torch.arange(total_length).unsqueeze(0)
    x = torch.full((1, total_length), mask_id, dtype=torch.long)
    x[:, :prompt_length] = input_ids
    prefill_blocks = prompt_length // block_length
    prefill_length = prefill_blocks * block_length
    counts = {} if counts is None else counts
    counts.setdefault("nfe", 0)
    counts.setdefault("tokens", 0)

    def run(cur_x, mask, pos, store):
        counts["nfe"] += 1
        counts["tokens"] += cur_x.shape[1]
        return model(cur_x, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                     store_kv=store)

    if prefill_length > 0:
        run(x[:, :prefill_length], full_mask[:, :prefill_length, :prefill_length], position_ids[:, :prefill_length],
            True)
    num_transfer = ref_num_transfer_tokens(block_length, denoising_steps)
    for nb in range(prefill_blocks, num_blocks):
        lo, hi = nb * block_length, (nb + 1) * block_length
        cur_x = x[:, lo:hi].clone()
        cur_mask = full_mask[:, lo:hi, :hi]
        cur_pos = position_ids[:, lo:hi]
        for step in range(denoising_steps + 1):
            mask_index = cur_x == mask_id
            if mask_index.sum() == 0:
                run(cur_x, cur_mask, cur_pos, True)
                break
            logits = run(cur_x, cur_mask, cur_pos, False).logits
            x0, x0_p = ref_sample(logits, temperature=temperature, top_k=top_k, top_p=top_p)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            if remasking_strategy == "sequential":
                for j in range(cur_x.shape[0]):
                    first = mask_index[j].nonzero(as_tuple=True)[0].min().item()
                    transfer[j, first:first + num_transfer[step]] = True
            elif remasking_strategy == "low_confidence_static":
                confidence = torch.where(mask_index, x0_p, -torch.inf)
                for j in range(confidence.shape[0]):
                    _, idx = torch.topk(confidence[j], num_transfer[step])
                    transfer[j, idx] = True
            elif remasking_strategy == "low_confidence_dynamic":
                confidence = torch.where(mask_index, x0_p, -torch.inf)
                for j in range(confidence.shape[0]):
                    high = confidence[j] > confidence_threshold
                    if high.sum() >= num_transfer[step]:
                        transfer[j] = high
                    else:
                        _, idx = torch.topk(confidence[j], num_transfer[step])
                        transfer[j, idx] = True
            else:
                raise ValueError(f"Unknown remasking strategy: {remasking_strategy}")
            if overwrites is not None and (transfer & ~mask_index).any():
                overwrites.append((nb, step, int((transfer & ~mask_index).sum())))
            cur_x[transfer] = x0[transfer]
        x[:, lo:hi] = cur_x
        if stopping_criteria_idx is not None and any(s in x[:, prompt_length:] for s in stopping_criteria_idx):
            break
    return x
