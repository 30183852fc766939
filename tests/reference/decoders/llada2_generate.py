"""Reference transcription of LLaDA 2.x's decoding loop (``LLaDA2MoeModelLM.generate`` with its
helpers ``_sample_with_temperature_topk_topp``, ``_top_k_logits``, ``_top_p_logits``,
``_get_num_transfer_tokens``; inclusionAI/dFactory ``models/llada2_moe/modeling_llada2_moe.py``, the
same in the Hugging Face release), restated for ``dllm``'s tests over the transcribed modelling
(tests/reference/modelling/llada2_modeling.py); no code copied.

Kept as in the original: the canvas of ``ceil((prompt + gen) / block) * block`` positions, blocks on
the grid from position 0 (the first decoded block holds the prompt's tail), one full forward of the
canvas up to the current block's end per step under the block-causal mask; proposals by
``torch.multinomial`` over ``softmax`` of the block's rows (ALL its rows, prompt tail included, so the
random stream is the official one), logits divided by the temperature only when it is > 0 and != 1
(so ``temperature=0`` samples at 1, as the original does despite its docstring); the per-step quota
``block // steps`` (+1 for the first ``block % steps`` steps); every mask whose sampled token's
probability is ``> threshold`` when there are at least the quota of them, else the ``min(quota,
masks left)`` most confident; ``eos_early_stop``; the stop after a block that holds ``eos_id``; the
answer cut after the first ``eos_id``. A proposal may be the mask id itself: it is committed and the
position stays masked (re-proposed at the next step, left masked when the block's steps run out).

Differences, inert for what is tested: the mask is passed as a bool [1, 1, T, T] (the original builds
``log`` of the 0/1 mask in bfloat16, its model dtype: the same attention). ``cur_x`` is a view of
the canvas, as there, so commits land in ``x`` directly.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def _top_k_logits(logits: torch.Tensor, k: Optional[int]) -> torch.Tensor:
    if k is None or k <= 0:
        return logits
    values, _ = torch.topk(logits, k)
    return torch.where(logits < values[..., -1, None], torch.full_like(logits, float("-inf")), logits)


def _top_p_logits(logits: torch.Tensor, p: Optional[float]) -> torch.Tensor:
    if p is None or p >= 1.0:
        return logits
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_mask = cum > p
    sorted_mask[..., 1:] = sorted_mask[..., :-1].clone()
    sorted_mask[..., 0] = False
    mask = torch.scatter(torch.full_like(logits, False, dtype=torch.bool), -1, sorted_indices, sorted_mask)
    return logits.masked_fill(mask, float("-inf"))


def _sample(logits: torch.Tensor, temperature: float, top_k, top_p) -> tuple[torch.Tensor, torch.Tensor]:
    shape = logits.shape[:-1]
    logits = logits.reshape(-1, logits.shape[-1])
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logits = _top_p_logits(_top_k_logits(logits, top_k), top_p)
    probs = F.softmax(logits, dim=-1)
    token = torch.multinomial(probs, num_samples=1)
    return token.view(*shape), torch.gather(probs, -1, token).view(*shape)


def num_transfer_tokens(block_length: int, steps: int) -> torch.Tensor:
    if steps == 0:
        return torch.tensor([], dtype=torch.int64)
    base, rem = divmod(block_length, steps)
    out = torch.full((steps,), base, dtype=torch.int64)
    out[:rem] += 1
    return out


@torch.no_grad()
def llada2_generate(model, inputs: torch.Tensor, *, temperature: float = 0.0, block_length: int = 32,
                    steps: int = 32, gen_length: int = 2048, top_p=None, top_k=None, eos_early_stop: bool = False,
                    minimal_topk: int = 1, threshold: float = 0.95, eos_id: int = 156892,
                    mask_id: int = 156895, canvas: Optional[list] = None) -> torch.Tensor:
    """The official loop; returns the generated ids after the prompt, up to and including the first
    ``eos_id`` (``[1, n]``); with ``eos_early_stop`` the original returns the prompt too. ``canvas``
    (a test hook, not in the original) receives the final canvas [1, total_length]."""
    steps = min(steps, gen_length // minimal_topk)
    input_ids = inputs
    prompt_length = input_ids.shape[1]
    num_blocks = (prompt_length + gen_length + block_length - 1) // block_length
    total_length = num_blocks * block_length
    block_mask = torch.tril(torch.ones(num_blocks, num_blocks))
    attn = (block_mask.repeat_interleave(block_length, dim=0).repeat_interleave(block_length, dim=1)
            [None, None].bool())
    position_ids = torch.arange(total_length)[None]
    x = torch.full((1, total_length), mask_id, dtype=torch.long)
    x[:, :prompt_length] = input_ids.clone()
    schedule = num_transfer_tokens(block_length, steps)
    for num_block in range(prompt_length // block_length, num_blocks):
        end = (num_block + 1) * block_length
        cur_x = x[:, :end]
        for step in range(steps):
            active = cur_x[:, -block_length:] == mask_id
            if active.sum() == 0:
                break
            logits = model(cur_x, attention_mask=attn[:, :, :end, :end], position_ids=position_ids[:, :end]).logits
            x0, x0_p = _sample(logits[:, -block_length:, :], temperature, top_k, top_p)
            quota = schedule[step].item()
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            confidence = torch.where(active, x0_p, -torch.inf)
            high = confidence[0] > threshold
            if high.sum().item() >= quota:
                transfer[0] = high
            else:
                _, idx = torch.topk(confidence[0], k=min(quota, active.sum().item()))
                transfer[0, idx] = True
            if transfer.any():
                cur_x[:, -block_length:][transfer] = x0[transfer]
            if eos_early_stop and (x0[transfer] == eos_id).any():
                eos_pos = (cur_x[0] == eos_id).nonzero(as_tuple=True)[0]
                if len(eos_pos) > 0 and (cur_x[0, prompt_length:eos_pos[0].item()] != mask_id).all():
                    return x[:, :total_length][:, :eos_pos[0].item() + 1]  # the original: prompt included here
        x[:, :end] = cur_x
        if eos_id is not None and (x[0, prompt_length:end] == eos_id).any():
            break
    if canvas is not None:
        canvas.append(x.clone())
    answer = x[:, :prompt_length + gen_length]
    eos = (answer[0][prompt_length:] == eos_id).nonzero(as_tuple=True)[0]
    first = eos[0].item() if len(eos) > 0 else gen_length
    return answer[:, prompt_length:prompt_length + first + 1]
