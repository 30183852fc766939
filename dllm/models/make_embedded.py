"""Regenerate the tiny random checkpoints shipped in ``dllm/models/embedded/``.

    dllm models make-embedded [--out DIR]

Deterministic: the same torch version writes the same tensors, config and tokenizer files.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from dllm.models.loading import EMBEDDED_DIR
from dllm.models.tiny import tiny

# name -> (family, seed)
EMBEDDED: dict[str, tuple[str, int]] = {
    "tiny-random-llada": ("llada", 0),
    "tiny-random-dream": ("dream", 1),
    "tiny-random-sdar": ("sdar", 2),  # block-causal (block 4), SDAR layout
    "tiny-random-fastdllm-v2": ("fastdllm_v2", 3),  # block-causal (block 8) with the token shift, Fast-dLLM v2 layout
}


def write_embedded(out: Path = EMBEDDED_DIR) -> list[Path]:
    """Write every embedded checkpoint under ``out`` (each directory replaced); returns them."""
    written = []
    for name, (family, seed) in EMBEDDED.items():
        target = out / name
        if target.exists():
            shutil.rmtree(target)
        tiny(family, seed=seed, dtype=torch.float32).save_pretrained(target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="dllm models make-embedded", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=EMBEDDED_DIR,
                        help="parent directory (default: the package's)")
    args = parser.parse_args(argv)
    for path in write_embedded(args.out):
        size = sum(f.stat().st_size for f in path.iterdir())
        print(f"{path}  ({size / 1024:.0f} KiB: {', '.join(sorted(f.name for f in path.iterdir()))})")


if __name__ == "__main__":
    main()
