"""The package's layout stays scannable (issue 46's bar): no folder of ``dllm/`` holds more than 12
modules except ``samplers/`` (one file per registered sampler), and no module is a numbered copy of
another (``model2.py`` beside ``model.py``); names of model families that carry a version (LLaDA 2,
Fast-dLLM v2) are the family's name, not a number."""

from __future__ import annotations

import re
from pathlib import Path

import dllm

ROOT = Path(dllm.__file__).parent
MAX_MODULES = 12
ONE_FILE_PER_ENTRY = {"samplers"}  # one module per registered sampler
FAMILY_NAMES = {"llada2", "fastdllm_v2"}  # LLaDA 2.x and Fast-dLLM v2: model families, not numbered copies


def _folders() -> list[Path]:
    return [p for p in [ROOT, *ROOT.rglob("*")] if p.is_dir() and (p / "__init__.py").exists()]


def _modules(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__"))


def test_no_folder_holds_more_than_twelve_modules():
    over = {str(f.relative_to(ROOT.parent)): len(_modules(f)) for f in _folders()
            if f.name not in ONE_FILE_PER_ENTRY and len(_modules(f)) > MAX_MODULES}
    assert not over, f"folders over {MAX_MODULES} modules (split into named sub-packages): {over}"


def test_no_numbered_module():
    numbered = [str(f.relative_to(ROOT.parent) / f"{m}.py") for f in _folders() for m in _modules(f)
                if re.search(r"\d$", m) and m not in FAMILY_NAMES]
    assert not numbered, f"numbered modules (name what differs instead): {numbered}"


DECODE_FIELDS = {"cache", "block_length", "steps", "tokens_per_step", "temperature"}
OPTION_NAMESPACES = {  # flat option names of a component that build DecodeSettings / call generate with them
    "dllm/eval/harness/config.py: HarnessConfig": "lm-eval's model_args keys (decode_setting -> DecodeSettings)",
    "dllm/drafters/dlm.py: DLMConfig": "the dlm drafter's registry options (its draft is a generate call)",
    "dllm/serve/http/protocol.py: _Common": "the request body's JSON fields (translate.diffusion_settings)",
}


def _decode_like_classes() -> list[str]:
    """Classes with a ``sampler`` field and two or more of the decode fields (annotated class bodies)."""
    import ast

    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = {t.target.id for t in node.body if isinstance(t, ast.AnnAssign) and
                         isinstance(t.target, ast.Name)}
                if "sampler" in names and len(names & DECODE_FIELDS) >= 2:
                    found.append(f"{path.relative_to(ROOT.parent)}: {node.name}")
    return found


def test_one_decode_settings_class():
    """``DecodeSettings`` is the one class that says how to decode; the only other classes with its
    fields are the flat option namespaces that build one (each named with why)."""
    assert sorted(_decode_like_classes()) == sorted(["dllm/settings.py: DecodeSettings", *OPTION_NAMESPACES])
