"""Draft trees for speculative decoding: verify many candidate continuations in one target forward.

    tree.py       the ``Tree`` structure (a chain is the width-1 tree) and path math on it
    builders.py   the registered tree builders (chain, ddtree, taps): draft distributions -> a Tree
    budget.py     the budget rule: cut a row's tree where expected tokens per unit of cost peak
    path_head.py  the learned path head: path-conditioned acceptance estimates for ``taps``
    verify.py     tree verification: the target's inputs for a tree, and the walk that accepts a path

DDTree (arXiv 2604.12989) and TAPS (arXiv 2606.00487). The names below resolve lazily (importing
this package loads no module), so each module imports its siblings directly.
"""

from __future__ import annotations

from dllm.lazy import lazy_exports

_LAZY = {
    **dict.fromkeys(["Tree", "ancestor_mask", "chain_tree", "expected_accepted", "on_path", "path_jumps",
                     "path_probs", "path_reduce", "path_reduce_reference", "path_scores", "select_subtree"], "tree"),
    **dict.fromkeys(["ChainBuilder", "DDTreeBuilder", "TAPS_ESTIMATORS", "TapsBuilder", "TapsConfig", "TreeBuilder",
                     "TreeBuilderSpec", "TreeConfig", "best_first_tree", "list_tree_builders", "make_tree_builder",
                     "register_tree_builder", "tree_builders"], "builders"),
    **dict.fromkeys(["best_sizes", "node_path_probs", "prune_for_cost"], "budget"),
    **dict.fromkeys(["PathHead", "PathScorer", "has_path_head", "load_path_head", "path_inputs"], "path_head"),
    **dict.fromkeys(["tree_inputs", "walk_tree", "walk_tree_reference"], "verify"),
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = sorted(_LAZY)
