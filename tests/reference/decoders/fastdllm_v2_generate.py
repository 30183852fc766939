"""Reference transcription of Fast-dLLM v2's decoding loop (``Fast_dLLM_QwenForCausalLM.generate`` and
``sample_with_top_p`` in the HF folder Efficient-Large-Model/Fast_dLLM_v2_7B ``modeling.py``; the same
per-block rule as NVlabs/Fast-dLLM ``v2/generation_functions.py``), restated for ``dllm``'s tests over
the transcribed modelling (``fastdllm_v2_modeling.py``); no code copied. One row, as the original
(its ``multinomial`` reads row 0 and its stop test row 0).

The loop, as there:

* the prompt's complete blocks are prefilled into ``past_key_values``; when the prompt ends on a
  block boundary the arg-max of its last row is appended (the token shift: row i - 1 predicts i);
* per block: masks up to the next boundary; while the block holds a mask, for each sub-block of
  ``small_block_size`` in turn, while it holds a mask: stop when the canvas after the block's
  starting length holds ``stop_token`` with no mask before its first occurrence; else one forward of
  the block (``update_past_key_values=False``; with ``use_block_cache`` a full block forward when the
  sub-block's first column is a mask or no block cache exists yet, else the sub-block alone against
  the block cache), logits rolled right by one, ``sample_with_top_p`` on the sub-block's rows, and
  every mask with ``p > threshold`` plus the most confident mask committed;
* a block without masks is forwarded once more with ``update_past_key_values=True`` and the arg-max
  of its last row appended; the output is cut after the first ``stop_token``.

Returns the ids and the number of forwards (the original counts none; the prefill is counted).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ref_sample_with_top_p(logits: torch.Tensor, top_p: float = 0.95, temperature: float = 1.0):
    if temperature > 0:
        scaled = logits / temperature
    else:
        p = torch.softmax(logits, dim=-1)
        return p.argmax(dim=-1), p
    probs = F.softmax(scaled, dim=-1)
    sorted_probs, sorted_idx = torch.sort(probs, descending=True)
    cum = torch.cumsum(sorted_probs, dim=-1)
    remove = cum > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = 0
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter_(dim=-1, index=sorted_idx, src=remove)
    probs[drop] = 0
    probs = probs / torch.sum(probs, dim=-1, keepdim=True)
    x = torch.multinomial(probs[0], num_samples=1).unsqueeze(0).squeeze(-1)
    return x, probs


def _stopped(x_t: torch.Tensor, prompt_length: int, stop_token: int, mask_id: int) -> bool:
    tail = x_t[:, prompt_length:]
    if stop_token not in tail:
        return False
    idx = (tail == stop_token).nonzero()[0][1]
    return int((x_t[:, prompt_length:prompt_length + idx] == mask_id).sum()) == 0


@torch.no_grad()
def fastdllm_v2_generate(model, input_ids: torch.Tensor, max_new_tokens: int, mask_id: int, stop_token: int,
                         threshold: float = 1.0, small_block_size: int = 8, block_size: int = 32,
                         top_p: float = 0.95, temperature: float = 0.0,
                         use_block_cache: bool = False) -> tuple[torch.Tensor, int]:
    nfe = 0
    num_blocks = max_new_tokens // block_size
    original = input_ids.shape[1]
    past = None
    if input_ids.shape[1] > block_size:
        out = model(input_ids[:, :(input_ids.shape[1] // block_size * block_size)], use_cache=True,
                    update_past_key_values=True, block_size=block_size)
        nfe += 1
        past = out.past_key_values
        if input_ids.shape[1] % block_size == 0:
            input_ids = torch.cat([input_ids, out.logits[:, -1:].argmax(dim=-1)], dim=1)
    n_small = block_size // small_block_size
    for _ in range(num_blocks):
        if stop_token in input_ids[:, original:]:
            break
        prompt_length = input_ids.shape[1]
        x_t = torch.cat([input_ids, torch.full((1, block_size - prompt_length % block_size), mask_id,
                                               dtype=torch.long, device=input_ids.device)], dim=1)
        block_past = None
        while True:
            if _stopped(x_t, prompt_length, stop_token, mask_id):
                break
            mask_idx = x_t[:, -block_size:] == mask_id
            if mask_idx.sum() == 0:
                out = model(x_t[:, -block_size:], use_cache=True, past_key_values=past, update_past_key_values=True,
                            block_size=block_size)
                nfe += 1
                past = out.past_key_values
                x_t = torch.cat([x_t, out.logits[:, -1:].argmax(dim=-1)], dim=1)
                break
            for sb in range(n_small):
                a = sb * small_block_size
                start = -block_size + a
                end = None if block_size == a + small_block_size else -block_size + a + small_block_size
                while True:
                    mask_idx = x_t[:, -block_size:] == mask_id
                    if mask_idx[:, start:end].sum() == 0:
                        break
                    if _stopped(x_t, prompt_length, stop_token, mask_id):
                        break
                    if use_block_cache:
                        if block_past is None or (x_t[:, -block_size + a] == mask_id).any():
                            out = model(x_t[:, -block_size:], use_cache=True, past_key_values=past,
                                        update_past_key_values=False, use_block_cache=True)
                            block_past = out.block_past_key_values
                            logits = torch.cat([out.logits[:, :1], out.logits[:, :-1]], dim=1)[:, start:end]
                        else:
                            logits = model(x_t[:, start:end], use_cache=True, past_key_values=past,
                                           update_past_key_values=False, use_block_cache=True,
                                           block_past_key_values=block_past, replace_position=a).logits
                            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
                    else:
                        logits = model(x_t[:, -block_size:], use_cache=True, past_key_values=past,
                                       update_past_key_values=False).logits
                        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)[:, start:end]
                    nfe += 1
                    x_1, p_1t = ref_sample_with_top_p(logits, top_p=top_p, temperature=temperature)
                    x1_p = torch.squeeze(torch.gather(p_1t, dim=-1, index=torch.unsqueeze(x_1, -1)), -1)
                    x1_p = torch.where(mask_idx[:, start:end], x1_p, -torch.inf)
                    unmask = x1_p > threshold
                    unmask[torch.arange(x_1.shape[0]), x1_p.argmax(dim=-1)] = True
                    unmask = unmask & mask_idx[:, start:end]
                    x_t[:, start:end][unmask] = x_1[unmask]
        input_ids = x_t
    if stop_token in input_ids[:, original:]:
        idx = (input_ids[:, original:] == stop_token).nonzero()[0][1]
        input_ids = input_ids[:, :idx + original + 1]
    return input_ids, nfe


def official_length(prompt_length: int, block_size: int, max_new_tokens: int) -> int:
    """Tokens the official loop generates when no stop token appears (each block's masks and the
    arg-max appended after it)."""
    n = prompt_length + (1 if prompt_length > block_size and prompt_length % block_size == 0 else 0)
    for _ in range(max_new_tokens // block_size):
        n += block_size - n % block_size + 1
    return n - prompt_length
