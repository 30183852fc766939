"""Every import between subpackages of ``dllm`` points down the layers (DESIGN: layers, low to high).

    0  registry, options, state, schedule, then inputs (which builds the initial DecodeState), rows
       (rows released mid-call) and outputs (EOS stops and the GenerationOutput)
    1  tasks, kernels                               (pure Python stress tasks; attention/fused kernels)
    2  models                                       (DiffusionLM, checkpoints, the K/V buffers, oracles)
    3  samplers, cache                              (step rules; cache policies)
    4  engine                                       (the one decode loop, its forwards and CUDA graphs)
    4.5 scoring                                     (decode settings, exact-match decode-and-score loop)
    5  drafters                                     (speculative decoding for AR targets)
    6  eval                                         (compare, stress, lm-eval harness, benchmarks)
    7  train                                        (imports scoring's exact-match evaluation, never eval)
    8  cli
    9  the package root ``dllm`` (lazy public API)

A module may import its own subpackage and anything in a strictly lower layer. Imports inside
functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import dllm

LAYERS: dict[str, int] = {
    "options": -0.5, "flags": -0.5, "registry": 0, "lazy": 0, "state": 0, "schedule": 0, "inputs": 0.5, "rows": 0.55, "outputs": 0.6,
    "tasks": 1, "kernels": 1,
    "models": 2,
    "samplers": 3, "cache": 3,
    "settings": 3.5,  # one DecodeSettings and its resolve: over samplers and caches, under the engine
    "engine": 4,  # the loop, the step's forwards (dllm.engine.forwards) and their CUDA graphs (dllm.engine.graphs)
    "scoring": 4.5,
    "drafters": 5,
    "serve": 5.5,  # the server: over the engine and the drafters, under eval (dllm bench serve) and cli
    "eval": 6,
    "train": 7,
    "cli": 8,
    "": 9,  # the package root
    "__main__": 9,  # python -m dllm
}

ROOT = Path(dllm.__file__).parent


def _unit(module: str) -> str:
    """``dllm.samplers.threshold`` -> ``samplers``; ``dllm`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported dllm module) for every import statement in the file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "dllm":  # ``from dllm import tasks`` names a subpackage
                found += [(node.lineno, f"dllm.{a.name}") if a.name in LAYERS else (node.lineno, "dllm")
                          for a in node.names]
            elif target.startswith("dllm."):
                found.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "dllm"]
    return found


def upward_imports() -> list[str]:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        src = _unit(_module_name(path))
        for line, target in _imports(path):
            dst = _unit(target)
            if dst == src:
                continue
            if src not in LAYERS or dst not in LAYERS:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} imports {target}: no layer for "
                           f"{src if src not in LAYERS else dst!r}; add it to LAYERS")
            elif LAYERS[dst] >= LAYERS[src]:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} ({src}, layer {LAYERS[src]}) imports "
                           f"{target} ({dst or 'dllm'}, layer {LAYERS[dst]})")
    return bad


def test_every_import_points_down_the_layers():
    bad = upward_imports()
    assert not bad, "upward or sideways imports:\n" + "\n".join(bad)


def test_the_walk_sees_a_planted_upward_import(tmp_path, monkeypatch):
    """The checker itself: a lower-layer file importing a higher one is reported."""
    pkg = tmp_path / "dllm"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "bad.py").write_text("def f():\n    from dllm.engine import generate\n")
    (pkg / "models" / "good.py").write_text("from dllm.kernels.attention import backends\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    bad = upward_imports()
    assert len(bad) == 1 and "models/bad.py:2" in bad[0] and "dllm.engine" in bad[0]


# ---- import cycles ------------------------------------------------------------------------------------
def _modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``: dotted name -> file."""
    return {_module_name(p): p for p in sorted(root.rglob("*.py"))}


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (never executed: annotations only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _targets(path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``dllm`` modules a file imports (lazy imports included): ``from a.b import c`` names the module
    ``a.b.c`` where that is a module, else ``a.b``; ``import a.b.c`` the longest prefix that is a module."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "dllm":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                while parts and ".".join(parts) not in modules:
                    parts.pop()
                if parts and parts[0] == "dllm":
                    out.add(".".join(parts))
    out.discard(name)
    return {t for t in out if t in modules}


def import_cycles(root: Path) -> list[list[str]]:
    """The strongly connected components of more than one module in the import graph of the package
    under ``root`` (Tarjan's algorithm), each sorted; an empty list when the graph has no cycle."""
    modules = _modules(root)
    graph = {m: sorted(_targets(p, modules)) for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # iterative depth-first search (the graph is deep enough for recursion limits)
        work = [(v, iter(graph[v]))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))

    for m in graph:
        if m not in index:
            visit(m)
    return sorted(found)


def test_no_import_cycles_anywhere_in_dllm():
    """No two modules of ``dllm`` import each other, directly or through others. Imports inside functions
    count (a lazy import is still a dependency); imports under ``if TYPE_CHECKING:`` do not (never run)."""
    cycles = import_cycles(ROOT)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_sees_a_planted_cycle(tmp_path, monkeypatch):
    """The checker itself: a three-module cycle through a lazy import is one component; a chain is none."""
    pkg = tmp_path / "dllm"
    (pkg / "eval").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "eval" / "__init__.py").write_text("")
    (pkg / "eval" / "a.py").write_text("from dllm.eval.b import f\n")
    (pkg / "eval" / "b.py").write_text("from dllm.eval import c\n")
    (pkg / "eval" / "c.py").write_text("def g():\n    import dllm.eval.a\n")
    (pkg / "eval" / "d.py").write_text("from dllm.eval.a import x\n")  # imports the cycle, is not in it
    type_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dllm.eval.f\n"  # never runs: no cycle
    (pkg / "eval" / "e.py").write_text(type_only)
    (pkg / "eval" / "f.py").write_text("import dllm.eval.e\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    assert import_cycles(pkg) == [["dllm.eval.a", "dllm.eval.b", "dllm.eval.c"]]
    (pkg / "eval" / "c.py").write_text("def g():\n    pass\n")
    assert import_cycles(pkg) == []


def test_train_does_not_import_eval():
    """Training's evaluation is ``dllm.scoring``'s; ``dllm.train`` never imports ``dllm.eval``."""
    bad = [f"{p.relative_to(ROOT.parent)}:{line} imports {t}" for p in sorted((ROOT / "train").rglob("*.py"))
           for line, t in _imports(p) if _unit(t) == "eval"]
    assert not bad, "\n".join(bad)
