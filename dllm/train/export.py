"""Copy a trained checkpoint into the package as an embedded model.

    dllm train export --run runs/tiny-llada --name tiny-llada [--checkpoint best] [--dtype bfloat16]
        [--note "how the run started, e.g. the earlier stages it continues"]

Writes ``dllm/models/embedded/<name>/`` (official config.json, model.safetensors, tokenizer files)
plus ``training.json`` (the step, the recipe, the checkpoint's last evaluation and an optional note:
a run that continues earlier stages says so there, since the recipe names its own stage only), so that
``dllm.load(<name>)`` works offline after a plain install. bfloat16 halves the file (the official
LLaDA and Dream checkpoints are bf16 too); ``dllm.load`` then defaults to the stored dtype. A Learn2PD
filter run (``final/filter.json``, ``dllm/train/learn2pd.py``) is copied as is (the note goes into
``filter.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import torch

EMBEDDED = Path(__file__).resolve().parent.parent / "models" / "embedded"


def _last_eval(run: Path) -> dict:
    best = run / "best.json"
    if best.exists():
        return json.loads(best.read_text())
    evals = [json.loads(l) for l in (run / "log.jsonl").read_text().splitlines() if '"eval' in l]
    return evals[-1] if evals else {}


def _is_causal_lm(src: Path) -> bool:
    config = src / "config.json"
    archs = json.loads(config.read_text()).get("architectures") or [] if config.exists() else []
    return any(str(a).endswith("ForCausalLM") for a in archs)


def export(run: Path, name: str, checkpoint: str = "best", dtype: str = "bfloat16",
           root: Path = EMBEDDED, note: str = "") -> Path:
    from dllm.models import load

    if (run / "final" / "filter.json").is_file():  # a Learn2PD filter (dllm/train/learn2pd.py): copied as is
        return _export_filter(run / "final", Path(root) / name, note)
    src = run / checkpoint if (run / checkpoint).exists() else None
    if src is None and (run / "final" / "config.json").exists():
        src = run / "final"  # an AR run (dllm/train/ar.py) ends in final/
    if src is None:
        ckpts = sorted(run.glob("checkpoint-*"))
        if not ckpts:
            raise FileNotFoundError(f"no checkpoint {checkpoint!r}, no final/ and no checkpoint-* under {run}")
        src = ckpts[-1]
    out = Path(root) / name
    if out.exists():
        shutil.rmtree(out)
    if _is_causal_lm(src):  # a transformers causal LM, saved in its shipped layout with its training.json
        shutil.copytree(src, out)
        if note:
            info = json.loads((out / "training.json").read_text()) if (out / "training.json").exists() else {}
            (out / "training.json").write_text(readable_json({**info, "note": note}) + "\n")
        return out
    model = load(str(src), dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    info = {"source": str(src), "dtype": dtype, "evaluation": _last_eval(run), **({"note": note} if note else {})}
    recipe = run / "recipe.json"
    if recipe.exists():
        info["recipe"] = json.loads(recipe.read_text())
    (out / "training.json").write_text(readable_json(info) + "\n")
    return out


def _export_filter(src: Path, out: Path, note: str) -> Path:
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    if note:
        info = json.loads((out / "filter.json").read_text())
        (out / "filter.json").write_text(json.dumps({**info, "note": note}, indent=2, sort_keys=True) + "\n")
    return out


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
    p.add_argument("--checkpoint", default="best")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--note", default="", help="stored in training.json (e.g. the stages the run continues)")
    args = p.parse_args(argv)
    out = export(args.run, args.name, args.checkpoint, args.dtype, note=args.note)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"wrote {out} ({size:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
