"""docs/design.md names every part of the package: each sub-package of ``dllm/`` (and of its
sub-packages) and each top-level module, so a new folder or module cannot land without a line there."""

from __future__ import annotations

from pathlib import Path

import dllm

ROOT = Path(dllm.__file__).parent
DESIGN = (ROOT.parent / "docs" / "design.md").read_text()


def parts() -> list[str]:
    names = [p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    for pkg in ROOT.rglob("__init__.py"):
        rel = pkg.parent.relative_to(ROOT)
        if str(rel) != "." and "embedded" not in rel.parts and "__pycache__" not in rel.parts:
            names.append(rel.as_posix() + "/")
    return sorted(names)


def test_every_sub_package_and_top_level_module_is_in_the_design_doc():
    missing = [n for n in parts() if n.rstrip("/").split("/")[-1] + ("/" if n.endswith("/") else "") not in DESIGN
               and f"dllm/{n}" not in DESIGN]
    assert not missing, f"docs/design.md does not name: {missing}"
