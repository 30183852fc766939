"""Per-request block size: a small head that reads the prefill and picks each row's block size.

BlockPilot (AMAP-ML/BlockPilot, arXiv 2606.31315) observes that the fastest block size of a block
drafter varies per input, and lets an MLP read the prefill representation once to pick it. Ours
reads what a target-conditioned drafter (DFlash) already gets from the prefill: the tapped target
hidden states of the prompt, ``[R, Lp, len(taps) * D]``, pooled as the mean over the prompt's
tokens concatenated with the last token's (``prompt_features``). A two-layer MLP maps that to one
score per candidate *plan* (``BlockHead``): a block size, with or without a draft tree (``trees``,
a tree builder spec per plan); the row's plan is the arg-max (``pick``). The rows of one call share
the tree setting (a round is a tree round or a chain round): the one most rows picked
(``plan.shared_tree``); each keeps its own block size in chain rounds, all run the largest in tree ones.

Training (``dllm.train.drafters.block_head_train``): at T = 0 the committed tokens are the target's greedy
answer, so the rounds a chain plan takes are a walk over the drafter's teacher-forced accepted
prefixes (a tree plan's come from one real greedy call); with the measured round time per plan, each
training prompt has a time per plan, and the head minimises the expected time under its softmax.

Files, beside a drafter checkpoint: ``block_head.json`` (sizes, feature and hidden widths, and how it
was made) and ``block_head.safetensors``. ``speculative_generate(..., plan="auto")`` uses the
drafter's head (``DFlashBlockDrafter.block_head``); a ``BlockHead`` may also be passed directly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn

HEAD_CONFIG = "block_head.json"
HEAD_WEIGHTS = "block_head.safetensors"


def prompt_features(hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Pooled prefill features. hidden [R, Lp, F] (left-padded rows), valid [R, Lp] bool -> [R, 2F]:
    the mean over each row's valid positions, then the last position's (always valid: left padding)."""
    w = valid.to(hidden.dtype)[:, :, None]  # [R, Lp, 1]
    mean = (hidden * w).sum(dim=1) / w.sum(dim=1).clamp_min(1.0)  # [R, F]
    return torch.cat([mean, hidden[:, -1]], dim=-1).float()  # [R, 2F]


class BlockHead(nn.Module):
    """Pooled prefill features [R, 2F] -> one score per candidate plan [R, S].

    A plan is a block size and, optionally, a draft-tree builder spec (``trees[i]``; None = the
    drafted chain), so one head can also choose between the chain and a tree per request."""

    def __init__(self, sizes: Sequence[int], features: int, hidden: int = 64, meta: Optional[dict] = None,
                 trees: Optional[Sequence[Optional[str]]] = None) -> None:
        super().__init__()
        sizes = tuple(int(s) for s in sizes)
        trees = tuple(trees) if trees is not None else (None,) * len(sizes)
        plans = list(zip(sizes, trees))
        if not sizes or any(s < 1 for s in sizes) or len(set(plans)) != len(plans) or len(trees) != len(sizes):
            raise ValueError(f"block head plans must be distinct (positive int size, tree spec or None) pairs, got "
                             f"sizes {list(sizes)} and trees {list(trees)}")
        self.sizes, self.trees = sizes, trees
        self.features, self.hidden, self.meta = int(features), int(hidden), dict(meta or {})
        # per-feature standardisation, set from the training features (``standardise``)
        self.register_buffer("shift", torch.zeros(self.features))
        self.register_buffer("scale", torch.ones(self.features))
        self.mlp = nn.Sequential(nn.Linear(self.features, self.hidden), nn.GELU(), nn.Linear(self.hidden, len(sizes)))

    def standardise(self, feats: torch.Tensor) -> None:
        """Set the input standardisation from training features [N, 2F]."""
        self.shift.copy_(feats.float().mean(dim=0))
        self.scale.copy_(feats.float().std(dim=0).clamp_min(1e-6))

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.mlp((feats.float() - self.shift) / self.scale)  # [R, S]

    def pick(self, feats: torch.Tensor) -> list[int]:
        """The chosen plan's index per row (host list: the loop's bookkeeping is host-side)."""
        if feats.dim() != 2 or feats.shape[1] != self.features:
            raise ValueError(f"the block head reads [rows, {self.features}] pooled features, got "
                             f"{list(feats.shape)}; was it trained for this drafter's tapped layers?")
        with torch.no_grad():  # the head stays where it was loaded: the [R, 2F] features come to it
            return self(feats.to(self.shift.device)).argmax(dim=1).tolist()  # host sync: once per call

    def choose(self, feats: torch.Tensor) -> list[int]:
        """The chosen block size per row."""
        return [self.sizes[i] for i in self.pick(feats)]

    @property
    def plans(self) -> list[tuple[int, Optional[str]]]:
        """(block size, tree spec or None) per plan, in score order."""
        return list(zip(self.sizes, self.trees))

    @property
    def tree_specs(self) -> list[str]:
        """The distinct tree builder specs among the plans."""
        return sorted({t for t in self.trees if t is not None})

    def save(self, directory: Union[str, Path]) -> Path:
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        cfg = {"sizes": list(self.sizes), "trees": list(self.trees), "features": self.features, "hidden": self.hidden,
               **self.meta}
        (directory / HEAD_CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(directory / HEAD_WEIGHTS))
        return directory


def has_block_head(directory: Union[str, Path]) -> bool:
    """Whether ``directory`` holds a block head (either file: a lone one is an error when read)."""
    return (Path(directory) / HEAD_CONFIG).is_file() or (Path(directory) / HEAD_WEIGHTS).is_file()


def load_block_head(directory: Union[str, Path]) -> BlockHead:
    """The head saved in ``directory`` (FileNotFoundError naming a missing file; ValueError naming a
    broken one: bad JSON, missing fields, truncated or mismatched weights)."""
    from dllm.models.heads import build_head, read_head_files

    cfg, tensors = read_head_files(directory, HEAD_CONFIG, HEAD_WEIGHTS, "block head")

    def make(c: dict) -> BlockHead:
        meta = {k: v for k, v in c.items() if k not in ("sizes", "trees", "features", "hidden")}
        return BlockHead(c["sizes"], c["features"], c["hidden"], meta, c.get("trees"))

    return build_head(make, cfg, tensors, directory, HEAD_CONFIG, HEAD_WEIGHTS, "block head")


__all__ = ["BlockHead", "has_block_head", "load_block_head", "prompt_features"]
