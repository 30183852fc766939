"""A path head: path-conditioned acceptance estimates for the ``taps`` tree builder.

A block drafter's marginal at depth d, ``q_d``, describes the target's token there averaged over the
paths above it; a tree node's real chance to be accepted is conditional on its own path (the walk
only reaches it when every ancestor was the target's token). TAPS (Wang, Huang, Chen, arXiv
2606.00487) builds its tree from such path-conditioned estimates. Ours come from a small learned
head: the drafter's final state at the node's depth, corrected by an MLP that reads the node's path,
then the drafter's own LM-head read-out:

    a(y | path) = softmax(lm_head(h_d + W2 gelu(W1 [h_d; e(parent); e(parent_top); e_dev(deviations)])))[y]

- ``parent``: the parent node's token (the anchor at depth 1), ``e`` the target's embedding table;
- ``parent_top``: the drafter's arg-max at the parent's depth: with ``parent`` it says whether the
  path deviated from the drafter's guess just above the node, and from which token to which;
- ``deviations``: how many of the node's ancestors are not the arg-max at their depth (0, 1, 2+).

Trained (``dllm train path-head``) on the target's own greedy answers, teacher-forced:
at every depth the parent is the target's token, exactly the condition under which the walk reaches
a node. W2 starts at zero (the head starts as the drafter's marginals).

Files, beside a drafter checkpoint: ``path_head.json`` (widths, how it was made, its evaluation) and
``path_head.safetensors``; the ``dflash`` drafter loads them with its weights and attaches a
``PathScorer`` to every ``Draft``; the ``taps`` builder reads it (``tree.TapsBuilder``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm.drafters.trees.tree import Tree, path_reduce

HEAD_CONFIG = "path_head.json"
HEAD_WEIGHTS = "path_head.safetensors"


class PathHead(nn.Module):
    """The correction MLP (see the module docstring); ``forward`` returns corrected states [.., D]."""

    def __init__(self, hidden_size: int, width: int = 32, max_deviations: int = 2, dropout: float = 0.0,
                 meta: Optional[dict] = None) -> None:
        super().__init__()
        if hidden_size < 1 or width < 1 or max_deviations < 0:
            raise ValueError(f"PathHead needs hidden_size >= 1, width >= 1 and max_deviations >= 0, got "
                             f"{hidden_size}, {width}, {max_deviations}")
        self.hidden_size, self.width, self.max_deviations = hidden_size, width, max_deviations
        self.meta = dict(meta or {})
        self.deviation = nn.Embedding(max_deviations + 1, hidden_size)
        self.fc1 = nn.Linear(4 * hidden_size, width)
        self.fc2 = nn.Linear(width, hidden_size)
        self.drop = nn.Dropout(dropout)
        nn.init.zeros_(self.fc2.weight)  # start as the drafter's marginals
        nn.init.zeros_(self.fc2.bias)

    def forward(self, states: torch.Tensor, parent: torch.Tensor, parent_top: torch.Tensor,
                deviations: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        """states [.., D] (the drafter's final states at the nodes' depths), parent / parent_top /
        deviations [..] long, embed [V, D] the target's embedding table -> corrected states [.., D]."""
        w = self.fc1.weight.dtype  # the head may be float32 beside a bfloat16 drafter
        x = torch.cat([states.to(w), F.embedding(parent, embed).to(w), F.embedding(parent_top, embed).to(w),
                       self.deviation(deviations.clamp(0, self.max_deviations))], dim=-1)  # [.., 4D]
        return states + self.fc2(self.drop(F.gelu(self.fc1(x)))).to(states.dtype)

    def save(self, directory: Union[str, Path]) -> Path:
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().float().contiguous() for k, v in self.state_dict().items()},
                  str(directory / HEAD_WEIGHTS))
        cfg = {"hidden_size": self.hidden_size, "width": self.width, "max_deviations": self.max_deviations,
               "meta": self.meta}
        (directory / HEAD_CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        return directory


def has_path_head(directory: Union[str, Path]) -> bool:
    """Whether ``directory`` holds a path head (either file: a lone one is an error when read)."""
    return (Path(directory) / HEAD_CONFIG).is_file() or (Path(directory) / HEAD_WEIGHTS).is_file()


def load_path_head(directory: Union[str, Path]) -> PathHead:
    """The path head saved in ``directory`` (FileNotFoundError naming a missing file, e.g. train one
    with dllm train path-head; ValueError naming a broken one)."""
    from dllm.models.heads import build_head, read_head_files

    cfg, tensors = read_head_files(directory, HEAD_CONFIG, HEAD_WEIGHTS, "path head")

    def make(c: dict) -> PathHead:
        return PathHead(int(c["hidden_size"]), int(c["width"]), int(c["max_deviations"]), meta=c.get("meta"))

    return build_head(make, cfg, tensors, directory, HEAD_CONFIG, HEAD_WEIGHTS, "path head")


def path_inputs(tree: Tree, top: torch.Tensor, anchor: torch.Tensor,
                jumps: Optional[list[torch.Tensor]] = None) -> tuple[torch.Tensor, ...]:
    """What the head reads for every node of ``tree``: (depth index [R, N] = depth - 1, parent token,
    the drafter's arg-max at the parent's depth, deviations among the strict ancestors), all long
    [R, N]. top: [R, K] the drafter's arg-max per depth; anchor: [R] (the root's token); jumps:
    ``tree.path_jumps(tree)`` when the caller has them. No host sync."""
    r, n = tree.tokens.shape
    depth_idx = (tree.depths - 1).clamp(min=0)  # [R, N]
    root = anchor[:, None].expand(r, n)
    parent = torch.where(tree.parents >= 0, tree.tokens.gather(1, tree.parents.clamp(min=0)), root)  # [R, N]
    parent_top = torch.where(tree.depths >= 2, top.gather(1, (tree.depths - 2).clamp(min=0)), root)  # [R, N]
    deviates = (tree.tokens != top.gather(1, depth_idx)) & tree.valid  # [R, N]
    deviations = path_reduce(tree, deviates.long(), "sum", top.shape[1], jumps) - deviates.long()  # strict ancestors
    return depth_idx, parent, parent_top, deviations


@dataclass
class PathScorer:
    """One round's path-conditioned estimates for the rows of a ``Draft`` (``Draft.paths``)."""

    head: PathHead
    states: torch.Tensor  # [R, K, D] the drafter's final states at depths 1..K
    anchor: torch.Tensor  # [R] long, the root's token
    embed: torch.Tensor  # [V, D] the target's embedding table
    read_out: Callable[[torch.Tensor], torch.Tensor]  # states [.., D] -> logits [.., V] (the drafter's head)

    @torch.no_grad()
    def node_log_accept(self, tree: Tree, log_probs: torch.Tensor,
                        jumps: Optional[list[torch.Tensor]] = None) -> torch.Tensor:
        """float32 [R, N]: log a(node | its path) for every node (padding: 0). ``log_probs`` [R, K, V]
        are the drafter's marginals (their arg-max is ``parent_top`` / the deviation test); jumps:
        ``tree.path_jumps(tree)`` when the caller has them."""
        r, n = tree.tokens.shape
        if self.states.shape[:2] != log_probs.shape[:2]:
            raise ValueError(f"path states {tuple(self.states.shape)} do not match the marginals "
                             f"{tuple(log_probs.shape)} (rows and depths must agree)")
        depth_idx, parent, parent_top, deviations = path_inputs(tree, log_probs.argmax(-1), self.anchor, jumps)
        d = self.states.shape[-1]
        states = self.states.gather(1, depth_idx[..., None].expand(r, n, d))  # [R, N, D]
        logits = self.read_out(self.head(states, parent, parent_top, deviations, self.embed)).float()  # [R, N, V]
        node = torch.log_softmax(logits, dim=-1).gather(2, tree.tokens[..., None])[..., 0]  # [R, N]
        return torch.where(tree.valid, node, torch.zeros_like(node))


__all__ = ["HEAD_CONFIG", "HEAD_WEIGHTS", "PathHead", "PathScorer", "has_path_head", "load_path_head",
           "path_inputs"]
