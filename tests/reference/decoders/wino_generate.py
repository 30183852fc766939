"""Reference transcription of WINO's LLaDA decoder (Feng-Hong/WINO-DLLM ``LLaDA/decoding.py``,
``decoding_wino``), restated from the public code for ``dllm``'s tests; no code copied.

Kept as in the original, because they can change a result: the canvas is ``prompt | gen | shadow``
(the shadow block of ``block_length`` masks after the whole generation region), position ids are
``arange(prompt + gen)`` then the current block's positions, the 4-D mask (real rows never see the
shadow; shadow rows see everything but the real token of their own position), ``last_accept = 30``
at each block start, ``max_accept = min(max(int(0.7 * #masks), 5), 20)``, the wide-in rule
``c > threshold`` with ``torch.topk`` when too many qualify and the arg-max when none, the float64
softmax, re-masking only when more than one token was accepted, and when ``last_accept`` or more
committed tokens have shadow probability ``< threshold_back`` only the ``last_accept - 1`` lowest.

Differences, inert for what is tested: temperature 0 only (the original draws Gumbel noise over the
whole extended canvas); batch 1 (as the original); the model is a callable ``forward(x, mask,
position_ids) -> logits``; ``forbid_mask_commit`` raises ``MaskCommitError`` instead of committing
the mask id (``dllm`` never proposes it); ``max_block_steps`` bounds the loop and raises when hit
(the original has no bound).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .llada_generate import MaskCommitError

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def wino_generate(forward: Forward, prompt: torch.Tensor, *, gen_length: int, block_length: int,
                  mask_id: int, threshold: float = 0.6, threshold_back: float = 0.9,
                  forbid_mask_commit: bool = True, max_block_steps: int = 10_000) -> tuple[torch.Tensor, int]:
    """prompt [1, P] -> (canvas [1, P + gen_length], forwards)."""
    assert prompt.shape[0] == 1 and gen_length % block_length == 0
    p, bl = prompt.shape[1], block_length
    total = p + gen_length
    x = torch.full((1, total + bl), mask_id, dtype=torch.long)
    x[:, :p] = prompt
    forwards = 0
    for nb in range(gen_length // bl):
        b0, b1 = p + nb * bl, p + (nb + 1) * bl
        masked = x == mask_id
        masked[:, b1:] = False  # only the current block (and never the shadow)
        done = torch.zeros_like(masked)  # shadow columns whose real token is committed
        done[:, -bl:] = ~masked[:, b0:b1]
        pos = torch.cat([torch.arange(total), torch.arange(b0, b1)])
        attn = torch.ones(1, 1, total + bl, total + bl, dtype=torch.bool)
        attn[:, :, :, -bl:] = False
        attn[:, :, -bl:, -bl:] = True
        attn[:, :, -bl:, b0:b1] = ~torch.eye(bl, dtype=torch.bool)
        last_accept = 30
        steps = 0
        while masked.any():
            steps += 1
            if steps > max_block_steps:
                raise RuntimeError(f"block {nb} did not finish in {max_block_steps} steps")
            max_accept = min(max(int(masked.sum() * 0.7), 5), 20)
            logits = forward(x, attn, pos)  # [1, T + BL, V]
            forwards += 1
            x0 = logits.argmax(dim=-1)
            shadow_src = torch.zeros_like(done)
            shadow_src[:, b0:b1] = done[:, -bl:]
            x0[done] = x[shadow_src]  # shadow rows score the committed token
            prob = F.softmax(logits.to(torch.float64), dim=-1)
            x0_p = torch.gather(prob, -1, x0[..., None]).squeeze(-1)
            x0 = torch.where(masked, x0, x)
            conf = torch.where(masked, x0_p, torch.tensor(-float("inf"), dtype=torch.float64))
            conf_back = torch.where(done, x0_p, torch.tensor(float("inf"), dtype=torch.float64))
            take = conf > threshold
            if take.sum() > max_accept:
                idx = torch.topk(conf.view(-1), k=max_accept).indices
                take = torch.zeros_like(take)
                take.view(-1)[idx] = True
            elif not take.any():
                take.view(-1)[torch.argmax(conf)] = True
            if forbid_mask_commit and (x0[take] == mask_id).any():
                raise MaskCommitError("wino reference would commit the mask id")
            x[take] = x0[take]
            n_accept = int(take.sum())
            if n_accept > 1:
                remask = conf_back < threshold_back
                if remask.sum() >= last_accept:
                    idx = torch.topk(conf_back.view(-1), k=last_accept - 1, largest=False).indices
                    remask = torch.zeros_like(remask)
                    remask.view(-1)[idx] = True
            else:
                remask = torch.zeros_like(take)
            remask_real = torch.zeros_like(remask)
            remask_real[:, b0:b1] = remask[:, -bl:]
            x[remask_real] = mask_id
            masked[take] = False
            masked[remask_real] = True
            take_shadow = torch.zeros_like(take)
            take_shadow[:, -bl:] = take[:, b0:b1]
            done[take_shadow] = True
            done[remask] = False
            last_accept = n_accept
    return x[:, :total], forwards
