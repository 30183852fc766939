"""Copy a trained checkpoint into the package as an embedded model.

    dllm train export --run runs/tiny-llada --name tiny-llada [--checkpoint best] [--dtype bfloat16]
        [--note "how the run started, e.g. the earlier stages it continues"]

Writes ``dllm/models/embedded/<name>/`` (official config.json, model.safetensors, tokenizer files)
plus ``training.json`` (the step, the recipe, the checkpoint's last evaluation and an optional note:
a run that continues earlier stages says so there, since the recipe names its own stage only), so that
``dllm.load(<name>)`` works offline after a plain install. bfloat16 halves the file (the official
LLaDA and Dream checkpoints are bf16 too); ``dllm.load`` then defaults to the stored dtype. A Learn2PD
filter run (``final/filter.json``, ``dllm/train/learn2pd.py``) is copied as is (the note goes into
``filter.json``), and so are an AR run's and a drafter run's ``final/`` (a transformers causal LM; a DFlash,
JetSpec, DFlare or DSpark drafter in its authors' layout; the note goes into ``training.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import torch

EMBEDDED = Path(__file__).resolve().parent.parent / "models" / "embedded"


def _checkpoint_step(src: Path) -> Optional[int]:
    """The step of a trainer checkpoint directory ``checkpoint-NNNNNNN`` (None for any other name)."""
    digits = src.name[len("checkpoint-"):]
    return int(digits) if src.name.startswith("checkpoint-") and digits.isdigit() else None


def _last_eval(run: Path, src: Path) -> dict:
    """The evaluation of the exported checkpoint ``src``: the one logged at its step (a ``best/``
    checkpoint's step is in its ``best.json``, else its ``checkpoint-N`` name), else the last one
    logged before it (``best.json`` itself when the log has none); the last one logged when ``src``
    has no step."""
    best = json.loads((src / "best.json").read_text()) if (src / "best.json").is_file() else None
    step = best.get("step") if best is not None else _checkpoint_step(src)
    log = run / "log.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []
    evals = [e for e in lines if "event" not in e and any(k.startswith("eval") for k in e)]
    if step is not None:
        evals = [e for e in evals if e.get("step", step) <= step]
        if best is not None and not any(e.get("step") == step for e in evals):
            return best
    return evals[-1] if evals else (best or {})


def latest_checkpoint(run: Path) -> Optional[Path]:
    """The newest complete ``checkpoint-N`` directory of ``run`` by step (a ``checkpoint-N.tmp`` left by a
    killed save is not one)."""
    found = [p for p in run.glob("checkpoint-*") if p.is_dir() and _checkpoint_step(p) is not None]
    return max(found, key=_checkpoint_step) if found else None


# the drafter runs' final/ (dllm/train/drafters/: DFlash and JetSpec, DFlare, DSpark), in their authors' layouts
DRAFTER_ARCHITECTURES = frozenset({"DFlashDraftModel", "QwenDFlareDraftModel", "Qwen3DSparkModel"})


def _copied_as_is(src: Path) -> bool:
    """A transformers causal LM (an AR run) or a drafter: saved by its trainer in its shipped layout.
    A diffusion checkpoint (a ``model_type`` dllm loads) is not, whatever its architecture's name
    (SDAR's is ``SDARForCausalLM``, Fast-dLLM v2's ``Fast_dLLM_QwenForCausalLM``)."""
    from dllm.models.families.registry import MODEL_TYPES

    config = src / "config.json"
    fields = json.loads(config.read_text()) if config.exists() else {}
    if fields.get("model_type") in MODEL_TYPES:
        return False
    archs = fields.get("architectures") or []
    return any(str(a).endswith("ForCausalLM") or a in DRAFTER_ARCHITECTURES for a in archs)


def export(run: Path, name: str, checkpoint: Optional[str] = None, dtype: Optional[str] = None,
           root: Path = EMBEDDED, note: str = "") -> Path:
    """``checkpoint``: one directory name under ``run`` (``best`` included), refused (FileNotFoundError, naming
    those there) when missing; None: ``best/``, else ``final/``, else the newest ``checkpoint-N``. ``dtype``: a
    diffusion run's stored dtype (None: bfloat16); a run copied as is (a filter, an AR model, a drafter) keeps
    its own, and a ``dtype`` given for one is refused (ValueError)."""
    from dllm.models import load

    check_name(name)  # before anything under root is removed
    if (run / "final" / "filter.json").is_file():  # a Learn2PD filter (dllm/train/learn2pd.py): copied as is
        _no_dtype(dtype, run / "final", "a Learn2PD filter")
        if checkpoint is not None:  # a filter run keeps one fitted filter: final/
            raise ValueError(f"--checkpoint {checkpoint}: {run} is a Learn2PD filter run, whose one filter is "
                             f"final/ (leave --checkpoint out)")
        _check_outside(run / "final", Path(root) / name)
        return _export_filter(run / "final", Path(root) / name, note)
    name_given = checkpoint is not None  # only the default falls back (a run without evaluations has no best/)
    checkpoint = "best" if checkpoint is None else checkpoint
    src = run / checkpoint if (run / checkpoint).exists() else None
    if src is None and name_given:
        found = sorted(p.name for p in run.glob("*") if p.is_dir() and (p / "config.json").is_file()
                       and not p.name.endswith(".tmp"))  # a save killed half-way is no checkpoint
        raise FileNotFoundError(f"no checkpoint {checkpoint!r} under {run}; there: {', '.join(found) or 'none'} "
                                f"(or leave --checkpoint out: best/, else final/, else the newest checkpoint-*)")
    if src is None and (run / "final" / "config.json").exists():
        src = run / "final"  # an AR run (dllm/train/ar.py) or a drafter run (dllm/train/drafters/) ends in final/
    if src is None:
        src = latest_checkpoint(run)
        if src is None:
            raise FileNotFoundError(f"no best/, no final/ and no checkpoint-* under {run}")
    copied = _copied_as_is(src)  # an AR model or a drafter, saved in its shipped layout with its training.json
    if copied:
        _no_dtype(dtype, src, "an AR model or a drafter")  # before the old export is removed
    out = Path(root) / name
    _check_outside(src, out)
    if copied:
        return _replace_dir(out, lambda tmp: _copy_with_note(src, tmp, "training.json", note))

    def write(tmp: Path) -> None:
        model = load(str(src), dtype=getattr(torch, dtype or "bfloat16"))
        model.save_pretrained(tmp)
        info = {"source": str(src), "dtype": dtype or "bfloat16", "evaluation": _last_eval(run, src),
                **({"note": note} if note else {})}
        recipe = run / "recipe.json"
        if recipe.exists():
            info["recipe"] = json.loads(recipe.read_text())
        (tmp / "training.json").write_text(readable_json(info) + "\n")

    return _replace_dir(out, write)


def _replace_dir(out: Path, write: Callable[[Path], None]) -> Path:
    """Have ``write`` fill the hidden sibling ``.<name>.tmp`` of ``out``, then put it in ``out``'s place: the old
    export is removed only once the new one is complete, so a checkpoint that fails to load or convert (or an
    interrupted copy) leaves the old export as it was and no partial directory behind."""
    tmp, old = out.with_name(f".{out.name}.tmp"), out.with_name(f".{out.name}.old")
    for stale in (tmp, old):  # left by a killed export
        if stale.exists():
            shutil.rmtree(stale)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def _copy_with_note(src: Path, dst: Path, info_file: str, note: str,
                    dump: Callable[[Any], str] = lambda obj: readable_json(obj)) -> None:
    """Copy ``src`` to ``dst``, adding ``note`` (when given) to its JSON file ``info_file``, written by ``dump``."""
    shutil.copytree(src, dst)
    if note:
        info = json.loads((dst / info_file).read_text()) if (dst / info_file).exists() else {}
        (dst / info_file).write_text(dump({**info, "note": note}) + "\n")


def check_name(name: str) -> None:
    """Refuse an export ``name`` that is not one directory name (``dllm/models/embedded/<name>/``, as
    ``dllm.models.loading.embedded_names`` lists them): ``""``, ``.``, ``..`` or a path would make the old
    export that ``export`` removes the embedded root itself or a directory outside it."""
    if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
        raise ValueError(f"--name {name!r}: the exported model's name must be one directory name, e.g. "
                         f"tiny-llada (not empty, '.', '..' or a path)")


def _check_outside(src: Path, out: Path) -> None:
    """Refuse an export whose checkpoint ``src`` lies in the directory ``out`` it replaces (removed once
    the new export is written)."""
    src, out = src.resolve(), out.resolve()
    if src == out or out in src.parents:
        raise ValueError(f"the checkpoint {src} lies in {out}, which the export replaces: export it under "
                         f"another --name, or from a copy")


def _no_dtype(dtype: Optional[str], src: Path, what: str) -> None:
    if dtype is not None:
        raise ValueError(f"--dtype {dtype} applies to a diffusion run's checkpoint; {src} is {what}, copied "
                         f"as saved in its own dtype (leave --dtype out)")


def _export_filter(src: Path, out: Path, note: str) -> Path:
    return _replace_dir(out, lambda tmp: _copy_with_note(
        src, tmp, "filter.json", note, dump=lambda obj: json.dumps(obj, indent=2, sort_keys=True)))


def readable_json(obj: Any, indent: int = 2, level: int = 0) -> str:
    """``json.dumps(obj, indent=2)``, except that a list of scalars stays on one line (a recipe's
    per-task size lists would otherwise take one line per number)."""
    pad, inner = " " * (indent * level), " " * (indent * (level + 1))
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(str(k))}: {readable_json(v, indent, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, (list, dict)) for v in obj):
        return "[\n" + ",\n".join(inner + readable_json(v, indent, level + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dllm train export", description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path)
    p.add_argument("--name", required=True)
    p.add_argument("--checkpoint", default=None,
                   help="a directory under --run (default: best/, else final/, else the newest checkpoint-*)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                   help="a diffusion run's stored dtype (default bfloat16); runs copied as is keep their own")
    p.add_argument("--note", default="", help="stored in training.json (e.g. the stages the run continues)")
    args = p.parse_args(argv)
    out = export(args.run, args.name, args.checkpoint, args.dtype, note=args.note)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"wrote {out} ({size:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
