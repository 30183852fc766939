"""JetSpec (Hu et al., arXiv 2606.18394; code hao-ai-lab/JetSpec): a causal parallel draft head and its
budgeted draft tree.

    io.py        the authors' checkpoint layout <-> a causal-head DFlashDrafter (load/save/random)
    tree.py      the ``jetspec`` tree builder (``accum_logp``: best-first node expansion, top-width children)
    drafter.py   the registered ``jetspec`` drafter (speculative_generate's ``drafter="jetspec:model=..."``)

The names below resolve lazily (importing this package loads no module).
"""

from __future__ import annotations

from dllm.lazy import lazy_exports

_LAZY = {
    "JetSpecDrafter": "drafter", "JetSpecOptions": "drafter",
    "JetSpecTreeBuilder": "tree", "JetSpecTreeConfig": "tree", "accum_logp_tree": "tree",
    "causal_copy": "io", "check_causal": "io", "load_jetspec": "io", "random_jetspec": "io", "save_jetspec": "io",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = sorted(_LAZY)
