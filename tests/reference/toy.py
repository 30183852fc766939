"""The toy model function that drives the reference transcripts in ``test_transcripts_*.py``: a fixed
random map from (token, position, mean context) to logits, which records every canvas it is called on."""

from __future__ import annotations

import torch

VOCAB = 40
MASK = 39
EOS = 3
EOT = 4


class ToyLM:
    """Deterministic toy model: logits depend on the token, its position and the mean context.

    ``boost`` adds a constant to given vocabulary columns (e.g. to make EOS likely).  The mask
    column gets -1e4 unless ``allow_mask`` so the references never propose the mask id.
    ``context=False`` makes the logits depend on the position only (then CFG is a no-op).
    Every input canvas is recorded in ``calls`` (a clone).
    """

    def __init__(self, seed=0, vocab=VOCAB, dim=16, mask_id=MASK, boost=None, allow_mask=False,
                 context=True, scale=4.0):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(vocab, dim, generator=g)
        self.pos = torch.randn(512, dim, generator=g)
        self.out = torch.randn(dim, vocab, generator=g) / dim**0.5
        self.mask_id = mask_id
        self.boost = boost or {}
        self.allow_mask = allow_mask
        self.context = context
        self.scale = scale
        self.calls: list[torch.Tensor] = []
        self.extra: list[tuple] = []

    def logits(self, x, positions=None):
        b, n = x.shape
        if positions is None:
            positions = torch.arange(n).expand(b, n)
        h = self.pos[positions]
        if self.context:
            e = self.emb[x]
            h = h + e + e.mean(dim=1, keepdim=True)
        out = torch.tanh(h) @ self.out * self.scale
        for col, val in self.boost.items():
            out[:, :, col] += val
        if not self.allow_mask:
            out[:, :, self.mask_id] = -1e4
        return out

    def llada_fn(self, x, attention_mask):
        self.calls.append(x.clone())
        self.extra.append((attention_mask,))
        return self.logits(x)

    def dream_fn(self, x, attention_mask, tok_idx):
        self.calls.append(x.clone())
        self.extra.append((attention_mask, tok_idx))
        return self.logits(x, tok_idx)


def make_prompt(batch=2, length=5, seed=123):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, MASK, (batch, length), generator=g)  # no specials, no mask


def expected_schedule(masks, steps):
    return [masks // steps + (1 if i < masks % steps else 0) for i in range(steps)]
