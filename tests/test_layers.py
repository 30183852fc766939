"""Every import between subpackages of ``dllm`` points down the layers (DESIGN: layers, low to high).

    0  registry, options, state, schedule, then inputs (which builds the initial DecodeState) and
       outputs (EOS stops and the GenerationOutput)
    1  tasks, kernels                               (pure Python stress tasks; attention/fused kernels)
    2  models                                       (DiffusionLM, checkpoints, the K/V buffers, oracles)
    3  samplers, cache                              (step rules; cache policies)
    4  engine                                       (the one decode loop)
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
from pathlib import Path

import dllm

LAYERS: dict[str, int] = {
    "registry": 0, "options": 0, "state": 0, "schedule": 0, "inputs": 0.5, "outputs": 0.6,
    "tasks": 1, "kernels": 1,
    "models": 2,
    "samplers": 3, "cache": 3,
    "engine": 4,
    "scoring": 4.5,
    "drafters": 5,
    "eval": 6,
    "train": 7,
    "cli_spec": 7.5,  # dllm spec, added to the command by cli.py
    "cli": 8,
    "": 9,  # the package root
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
    monkeypatch.setattr(__import__(__name__), "ROOT", pkg)
    bad = upward_imports()
    assert len(bad) == 1 and "models/bad.py:2" in bad[0] and "dllm.engine" in bad[0]
