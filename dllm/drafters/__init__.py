"""Lossless speculative decoding for autoregressive transformers targets, drafted by registered drafters.

>>> from dllm.drafters import load_target, speculative_generate, list_drafters
>>> target, tok = load_target("Qwen/Qwen3-0.6B")
>>> out = speculative_generate(target, "ngram:max_ngram=3", "Once upon a time", max_new_tokens=64, tokenizer=tok)
>>> out.texts[0], out.tau, out.summary()

Layout: ``loop.py`` (the one round body), ``plan.py`` (a Plan: block size + tree, or "auto"),
``verify.py`` (chain verification), ``base.py`` (the drafter protocol and registry), ``ngram.py`` /
``dlm.py`` / ``failfast.py`` (drafters), ``target.py`` (the transformers target; loaded by
``dllm.models.targets``), ``rounds.py`` (a round's host state), ``stops.py`` / ``output.py``;
``fast_path/`` (the batch-1 chain round on a static KV buffer), ``dflash/`` (DFlash and DFlash 2
checkpoints, the block head) and ``trees/`` (tree structure, builders, budget rule, path head, tree
verification).

The names below resolve lazily (importing ``dllm.drafters`` loads nothing; each name imports its
own module on first use), so a submodule may import any other without cycles through this file.
The verification rules are ``greedy_verify`` / ``speculative_verify``; the dispatching ``verify``
function stays in ``dllm.drafters.verify`` (that name is the submodule here).
"""

from __future__ import annotations

from dllm.lazy import lazy_exports

_LAZY = {
    "speculative_generate": ("dllm.drafters.loop", "speculative_generate"),
    "Plan": ("dllm.drafters.plan", "Plan"),
    "SpeculativeOutput": ("dllm.drafters.output", "SpeculativeOutput"),
    "make_drafter": ("dllm.drafters.base", "make_drafter"),
    "list_drafters": ("dllm.drafters.base", "list_drafters"),
    "register_drafter": ("dllm.drafters.base", "register_drafter"),
    "Drafter": ("dllm.drafters.base", "Drafter"),
    "Draft": ("dllm.drafters.base", "Draft"),
    "DraftContext": ("dllm.drafters.base", "DraftContext"),
    "DraftSession": ("dllm.drafters.base", "DraftSession"),
    "DraftSetup": ("dllm.drafters.base", "DraftSetup"),
    "TargetInfo": ("dllm.drafters.base", "TargetInfo"),
    "SamplingParams": ("dllm.drafters.verify", "SamplingParams"),
    "greedy_verify": ("dllm.drafters.verify", "greedy_verify"),
    "speculative_verify": ("dllm.drafters.verify", "speculative_verify"),
    "load_target": ("dllm.models.targets", "load_target"),
    "resolve_target": ("dllm.models.targets", "resolve_target"),
    "Tree": ("dllm.drafters.trees.tree", "Tree"),
    "make_tree_builder": ("dllm.drafters.trees.builders", "make_tree_builder"),
    "list_tree_builders": ("dllm.drafters.trees.builders", "list_tree_builders"),
    "register_tree_builder": ("dllm.drafters.trees.builders", "register_tree_builder"),
    "PathHead": ("dllm.drafters.trees.path_head", "PathHead"),
    "load_path_head": ("dllm.drafters.trees.path_head", "load_path_head"),
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = sorted(_LAZY)
