"""A speculative ``Plan``: what one round verifies (a block size and a tree, or "auto").

    Plan(block_size=8)                          a chain of K = 7 drafts after the anchor, per round
    Plan(block_size=16, tree="ddtree:budget=16")  a draft tree (depth <= 15, 16 nodes) per round
    Plan.auto() / "auto"                        each row's plan picked after the prefill by the
                                                drafter's block head (BlockPilot, arXiv 2606.31315)

The chain is the width-1 tree (``trees.tree.chain_tree``): one round body serves both
(``loop.py``). ``speculative_generate(plan=...)`` takes a Plan, ``"auto"``, a ``BlockHead`` or an
int (the block size), and nothing else says what a round verifies: a call with ``block_size=`` or
``tree=`` is a TypeError pointing at ``plan=`` (``unexpected_keywords``).

After the prefill a plan becomes ``RowPlans``: per call row the block size that runs, and the one
tree builder the call's rounds share (a round is a tree round or a chain round for every row: with
a head, the tree most rows picked, ``shared_tree``; its rows then all run the largest picked block
size). ``SpeculativeOutput.row_block_sizes`` / ``row_trees`` report these, i.e. what ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

PLAN_FORMS = "a Plan, 'auto', a BlockHead or a positive int block size"


@dataclass(frozen=True)
class Plan:
    block_size: Optional[int] = None  # B: the anchor + K = B - 1 drafts per round; None = the drafter's
    tree: Any = None  # a tree builder spec ("ddtree:budget=16", a mapping or a TreeBuilder); None = the chain
    head: Any = None  # "auto" (the drafter's block head) or a BlockHead: per-row plans after the prefill

    @classmethod
    def auto(cls, head: Any = "auto") -> "Plan":
        """Per-row plans picked by a block head (the drafter's by default)."""
        return cls(head=head)

    def __post_init__(self) -> None:
        b = self.block_size
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise ValueError(f"Plan block_size must be a positive int (the anchor plus block_size - 1 drafts) "
                             f"or None, got {b!r}")
        if self.head is not None and (self.block_size is not None or self.tree is not None):
            raise ValueError("a Plan with a block head picks each row's block size and tree itself; give "
                             "head= alone, or block_size= / tree= without a head")


def as_plan(plan: Any) -> Plan:
    """``plan=`` -> a Plan (ValueError naming the accepted forms)."""
    from dllm.drafters.dflash.block_head import BlockHead

    if plan is None:
        return Plan()
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, BlockHead) or plan == "auto":
        return Plan(head=plan)
    if isinstance(plan, int) and not isinstance(plan, bool):
        return Plan(block_size=plan) if plan >= 1 else _bad("plan", plan)
    return _bad("plan", plan)


def _bad(name: str, value: Any) -> Plan:
    raise ValueError(f"{name} must be {PLAN_FORMS}, got {value!r:.80}")


def unexpected_keywords(function: str, names: Sequence[str]) -> TypeError:
    """The TypeError for keywords ``function`` does not take; ``block_size`` and ``tree`` are a plan's
    fields, so for them it says how to give the plan."""
    listed = ", ".join(repr(n) for n in names)
    message = f"{function}() got an unexpected keyword argument {listed}"
    if {"block_size", "tree"} & set(names):
        message += ("; the block size and the draft tree are the plan: plan=8, "
                    "plan=Plan(block_size=16, tree='ddtree:budget=16') or plan='auto' (dllm.drafters.Plan)")
    return TypeError(message)


@dataclass
class RowPlans:
    """What runs, per call row: ``sizes[j]`` the block size of row j, ``tree`` the spec the call's
    rounds share (None: chain rounds) and ``builder`` its TreeBuilder."""

    sizes: list[int]
    tree: Optional[str] = None
    builder: Any = None


def shared_tree(picks: Sequence[int], trees: Sequence[Optional[str]]) -> Optional[str]:
    """The tree setting a call's rows share (a round is a tree round or a chain round for every row):
    the one most rows picked, ties to the plan listed first."""
    counts: dict[Optional[str], int] = {}
    for i in picks:
        counts[trees[i]] = counts.get(trees[i], 0) + 1
    first = {t: min(i for i in picks if trees[i] == t) for t in counts}
    return max(counts, key=lambda t: (counts[t], -first[t]))


def head_row_plans(picks: Sequence[int], head: Any, builders: dict) -> RowPlans:
    """A block head's picks -> what runs: the shared tree (``shared_tree``); in tree rounds every
    row runs the largest picked block size (one tree depth per round), in chain rounds its own."""
    sizes = [head.sizes[i] for i in picks]
    spec = shared_tree(picks, head.trees)
    if spec is not None:
        sizes = [max(sizes)] * len(sizes)
    return RowPlans(sizes=sizes, tree=spec, builder=None if spec is None else builders[spec])


__all__ = ["PLAN_FORMS", "Plan", "RowPlans", "as_plan", "head_row_plans", "shared_tree", "unexpected_keywords"]
