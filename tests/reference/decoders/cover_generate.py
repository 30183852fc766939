"""Reference for COVER (Xiang et al., "Stop the Flip-Flop: Context-Preserving Verification for Fast
Revocable Diffusion Decoding", arXiv 2602.06161), written plainly from the rules in
``dllm/samplers/cover.py``'s docstring: no authors' code was found to transcribe, and the paper's
method section was not available to us beyond its abstract, so this is the algorithm as ``dllm``
states it, one row, one position at a time, for ``dllm``'s tests.

Per block, while it has masks, one forward of ``canvas | shadow block`` (the shadow: one mask per
block column, at that column's position, or one earlier for a shifted family such as Dream; real
rows never see it; shadow row k sees every real key except column ``start + k``, and every shadow
key) gives the draft logits (real rows) and the leave-one-out logits (shadow rows); then:

1. draft: the masks with float64 confidence ``> threshold``; when more than
   ``min(max(floor(accept_ratio * #masks), min_accept), max_accept)`` qualify, that many of the most
   confident masks; when none, the most confident one (ties: the leftmost);
2. seeds: the tokens committed at earlier steps of the block, scored
   ``(1 - p) + influence_weight * n_after / W + drift_weight * n_new / W`` (``p``: the latest
   probability of the token, ``n_after``: tokens committed at a later step, ``n_new``: other
   committed tokens now less those in view at the token's last judgement, at least 0); the
   ``min(ceil(seed_ratio * a), max_seeds)`` best with a score ``>= seed_threshold`` (ties: the
   leftmost), ``a`` the number of tokens the previous step of the block drafted (0 at its start);
3. verify: a seed fails when its leave-one-out probability is ``< verify_threshold`` and (with
   ``same_argmax_passes``) the leave-one-out arg-max (never the mask id) is another token;
4. revoke: the failing seeds, least likely first (ties: the leftmost), at most ``accepted - 1``,
   become masks again;
5. records: a drafted token keeps its confidence and the number of committed tokens the forward
   saw; a seed that passed its leave-one-out probability and that number less itself.

Greedy only (T = 0); batch 1; ``forward(ids [1, T], positions [1, T], mask [1, 1, T, T]) -> raw
logits [1, T, V]`` is the model's unshifted forward; ``shift`` is its logit shift (Dream: 1, the
real rows' logits are shifted one column right, the shadow rows' are not).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _view(forward: Forward, x: torch.Tensor, b0: int, b1: int, mask_id: int,
          shift: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft logits [T, V], leave-one-out logits [W, V]) from one forward with a shadow block."""
    t, w = x.shape[1], b1 - b0
    ids = torch.cat([x, torch.full((1, w), mask_id, dtype=torch.long)], dim=1)
    pos = torch.cat([torch.arange(t), torch.arange(b0 - shift, b1 - shift)])[None]
    attn = torch.zeros(1, 1, t + w, t + w, dtype=torch.bool)
    attn[:, :, :, :t] = True  # every row sees every real key ...
    attn[:, :, t:, t:] = True  # ... shadow rows see the shadow ...
    for k in range(w):
        attn[0, 0, t + k, b0 + k] = False  # ... but not the real token they predict
    raw = forward(ids, pos, attn)[0]  # [T + W, V]
    real = raw[:t]
    if shift:
        real = torch.cat([real[:1], real[:-1]], dim=0)
    return real, raw[t:]


def _argmax_not(row: torch.Tensor, banned: int) -> int:
    z = row.clone()
    z[banned] = float("-inf")
    return int(z.argmax())


def cover_generate(forward: Forward, prompt: torch.Tensor, *, gen_length: int, block_length: int, mask_id: int,
                   shift: int = 0, threshold: float = 0.6, accept_ratio: float = 0.7, min_accept: int = 5,
                   max_accept: int = 20, verify_threshold: float = 0.9, same_argmax_passes: bool = True,
                   seed_ratio: float = 1.0, max_seeds: int = 8, seed_threshold: float = 0.05,
                   influence_weight: float = 0.5, drift_weight: float = 0.5) -> tuple[torch.Tensor, int, int]:
    """prompt [1, P] -> (canvas [1, P + gen_length], forwards, revocations)."""
    assert prompt.shape[0] == 1
    p = prompt.shape[1]
    total = p + gen_length
    x = torch.full((1, total), mask_id, dtype=torch.long)
    x[:, :p] = prompt
    forwards = revocations = 0
    for b0 in range(p, total, block_length):
        b1 = min(b0 + block_length, total)
        w = b1 - b0
        prob, seen, order = [0.0] * w, [0] * w, [-1] * w
        step = last_accept = 0
        while (x[0, b0:b1] == mask_id).any():
            if step >= w:
                raise RuntimeError(f"block [{b0}, {b1}) did not finish in {w} steps")
            real, loo = _view(forward, x, b0, b1, mask_id, shift)
            forwards += 1
            cur = [int(v) for v in x[0, b0:b1]]
            masked = [j for j in range(w) if cur[j] == mask_id]
            p_real = torch.softmax(real[b0:b1].to(torch.float64), dim=-1)  # [W, V]
            tok = {j: _argmax_not(real[b0 + j], mask_id) for j in masked}
            conf = {j: float(p_real[j, tok[j]]) for j in masked}
            by_conf = sorted(masked, key=lambda j: (-conf[j], j))
            cap = min(max(math.floor(len(masked) * accept_ratio), min_accept), max_accept)
            take = [j for j in masked if conf[j] > threshold]
            if len(take) > cap:
                take = by_conf[:cap]
            elif not take:
                take = by_conf[:1]
            accepted = len(take)

            committed = [j for j in range(w) if order[j] >= 0 and cur[j] != mask_id]
            others = max(len(committed) - 1, 0)
            score = {}
            for j in committed:
                n_after = sum(1 for i in committed if order[i] > order[j])
                n_new = max(others - seen[j], 0)
                score[j] = (1 - prob[j]) + influence_weight * (n_after / w) + drift_weight * (n_new / w)
            budget = min(math.ceil(last_accept * seed_ratio), max_seeds)
            eligible = [j for j in committed if score[j] >= seed_threshold]
            seeds = sorted(eligible, key=lambda j: (-score[j], j))[:budget]
            p_loo = torch.softmax(loo.to(torch.float64), dim=-1)  # [W, V]
            q = {j: float(p_loo[j, cur[j]]) for j in seeds}
            fail = [j for j in seeds if q[j] < verify_threshold
                    and not (same_argmax_passes and _argmax_not(loo[j], mask_id) == cur[j])]
            revoke = sorted(fail, key=lambda j: (q[j], j))[:max(accepted - 1, 0)]

            for j in take:
                x[0, b0 + j] = tok[j]
                prob[j], seen[j], order[j] = conf[j], len(committed), step
            for j in seeds:
                if j not in revoke:
                    prob[j], seen[j] = q[j], len(committed) - 1
            for j in revoke:
                x[0, b0 + j] = mask_id
                order[j] = -1
            revocations += len(revoke)
            last_accept = accepted
            step += 1
    return x, forwards, revocations
