"""Reference transcription of Learn2PD's decoding loops (ims-kdks/Learning-to-Parallel-Decoding,
``llada/generate.py``: ``generate_learn2parallel`` (L2P) and ``generate_l2p_eot`` (L2P + EoT), with
``add_gumbel_noise`` and ``get_num_transfer_tokens``; the filter ``LogisticRegression`` of
``model/small_model.py``, two layers, as the authors ship it), restated from the public code for
``dllm``'s tests; no code copied.

Kept as the reference runs it (batch 1, no KV cache): the canvas ``x = [prompt | mask * G]``;
blocks of ``block_length`` left to right, ``steps`` split evenly over them (the authors' runs:
``steps = gen_length``, one scheduled commit per step), LLaDA's per-step counts from the block's
masks at its start; while the block has a mask:

1. forward the whole canvas; ``x0 = argmax(add_gumbel_noise(logits, T))`` at every position (the
   plain arg-max at T = 0, else ``exp(float64 logits) / (-log u)^T`` with ``u`` a float64
   ``rand_like`` of the whole logits); ``x0_p = softmax(logits)[x0]`` in the logits' dtype;
2. the filter reads ``x0_p`` of the block (float32; zero-padded to its width when the block is
   narrower, the first outputs kept) and accepts the masks with ``sigmoid > accept_thres``;
3. EoT only: the filter's accepted EOS proposals, and the confidences of every mask of the canvas
   that proposes EOS (-inf elsewhere), are noted before anything is committed;
4. the scheduled count of the most confident masks of the block (``torch.topk`` of the canvas row,
   -inf off the block's masks) is added to the accepted set, and the set is written;
5. EoT only: the canvas is cut after the first filter-accepted EOS, else after the most confident
   EOS proposal among the masks (``argmax``), when there is one.

Differences, inert for what is tested: the model is a ``dllm`` model called on raw ids (Dream's
logits come shifted, row i predicting position i: the reference's LLaDA loop applied to a Dream
model, as the authors' Dream training-data script reads Dream's logits); the EOS id is the model's
(the authors hard-code LLaDA-8B's 126081); uniforms come from ``generator``; classifier-free
guidance and ``remasking="random"`` (not in the authors' Learn2PD runs) are left out.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def small_model(weights: dict[str, torch.Tensor], conf: torch.Tensor) -> torch.Tensor:
    """The authors' two-layer ``LogisticRegression``: pad to the input width, linear1, ReLU,
    linear2, crop. conf [1, W] -> [1, W]."""
    width = weights["linear1.weight"].shape[1]
    w = conf.shape[-1]
    x = F.pad(conf, (0, width - w)) if w != width else conf
    x = F.linear(x, weights["linear1.weight"], weights["linear1.bias"])
    x = torch.relu(x)
    x = F.linear(x, weights["linear2.weight"], weights["linear2.bias"])
    return x[:, :w] if w != width else x


def transfer_counts(block_masks: torch.Tensor, steps: int) -> torch.Tensor:
    """``get_num_transfer_tokens``: [1, steps] counts ``m // steps + (i < m % steps)``."""
    m = block_masks.sum(dim=1, keepdim=True)
    out = torch.zeros(m.size(0), steps, dtype=torch.int64) + m // steps
    for i in range(m.size(0)):
        out[i, :int(m[i] % steps)] += 1
    return out


@torch.no_grad()
def learn2pd_generate(model, weights: dict[str, torch.Tensor], prompt: list[int], gen_length: int, *,
                      block_length: int, accept_thres: float, mask_id: int, eos_id: int, eot: bool = False,
                      steps: Optional[int] = None, temperature: float = 0.0,
                      generator: Optional[torch.Generator] = None) -> tuple[list[int], int]:
    """The generated ids (the canvas after the prompt: fewer than ``gen_length`` when EoT cut it)
    and the number of forwards."""
    steps = gen_length if steps is None else steps
    x = torch.tensor([list(prompt) + [mask_id] * gen_length])
    lp = len(prompt)
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    per_block = steps // num_blocks
    forwards = 0
    for b in range(num_blocks):
        s, e = lp + b * block_length, lp + (b + 1) * block_length
        counts = transfer_counts(x[:, s:e] == mask_id, per_block)
        i = 0
        while (x[:, s:e] == mask_id).any():
            mask_index = x == mask_id
            logits = model(x).logits  # [1, L, V]
            forwards += 1
            if temperature == 0:
                x0 = logits.argmax(dim=-1)
            else:
                l64 = logits.to(torch.float64)
                u = torch.rand(l64.shape, dtype=torch.float64, generator=generator)
                x0 = (l64.exp() / (-torch.log(u)) ** temperature).argmax(dim=-1)
            p = torch.softmax(logits, dim=-1)
            x0_p = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)  # [1, L]
            accept = torch.zeros_like(x0, dtype=torch.bool)
            accept[:, s:e] = torch.sigmoid(small_model(weights, x0_p[:, s:e].float())) > accept_thres
            accept = torch.where(mask_index, accept, False)
            if eot:
                filter_eot = (x0 == eos_id) & accept
                eot_conf = torch.where((x0 == eos_id) & mask_index, x0_p, -torch.inf)
            x0_p[:, e:] = -torch.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -torch.inf)
            _, top = torch.topk(confidence[0], k=int(counts[0, i]))
            accept[0, top] = True
            x[accept] = x0[accept]
            if eot:
                if filter_eot.any():
                    cut = int(filter_eot.to(torch.int8).argmax(dim=-1)[0])
                    x = x[:, :cut + 1]
                elif (eot_conf > -torch.inf).any():
                    cut = int(eot_conf.argmax(dim=-1)[0])
                    x = x[:, :cut + 1]
            i += 1
    return x[0, lp:].tolist(), forwards
