"""Decoding-order picture: at which step each generated position was committed.

``out = dllm.generate(model, prompts, ..., return_trace=True)`` records, per generated position, the
(global) sampler step that committed it (``out.trace``, [B, G], -1: never). ``commit_steps(out)``
returns that tensor; ``plot_order(out, "order.png")`` draws it as a heatmap: rows = prompts, columns
= generated positions, colour = commit step, never-committed cells blank, and, for short answers
(<= 32 positions) with a tokenizer, the committed token written in each cell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import torch

MAX_TEXT_POSITIONS = 32  # write the token text into the cells only up to this many columns


def commit_steps(out) -> torch.Tensor:
    """[B, G] long: the step at which each generated position of ``out`` was committed (-1: never)."""
    trace = getattr(out, "trace", None)
    if trace is None:
        raise ValueError("this GenerationOutput has no trace: call dllm.generate(..., return_trace=True)")
    gen_length = out.sequences.shape[1] - out.prompt_length
    if trace.dim() != 2 or tuple(trace.shape) != (out.sequences.shape[0], gen_length):
        raise ValueError(f"trace of shape {tuple(trace.shape)} does not match the batch "
                         f"[{out.sequences.shape[0]}, {gen_length}] (rows, generated positions)")
    return trace.detach().to("cpu", torch.long).clone()


def check_png_path(path: Union[str, Path]) -> Path:
    """``path`` as a Path; ValueError unless it ends in .png."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"the decoding-order picture is a PNG: give a path ending in .png, got {str(path)!r}")
    return path


def _token_text(tokenizer: Any, token_id: int) -> str:
    text = ""
    try:
        text = tokenizer.decode([token_id]).strip()
    except Exception:  # noqa: BLE001 - ids past the tokenizer, odd tokenizers: fall back below
        pass
    if not text:
        piece = tokenizer.convert_ids_to_tokens(token_id)
        text = piece if isinstance(piece, str) else f"<{token_id}>"
    return text if len(text) <= 6 else text[:5] + "\u2026"


def _row_label(tokenizer: Any, ids: list[int], index: int) -> str:
    if tokenizer is None:
        return f"row {index}"
    pad = getattr(tokenizer, "pad_token_id", None)
    try:
        text = tokenizer.decode([t for t in ids if t != pad]).strip()
    except Exception:  # noqa: BLE001
        return f"row {index}"
    text = " ".join(text.split())
    return text if len(text) <= 40 else "\u2026" + text[-39:]  # the end of a prompt says most


def plot_order(out, path: Union[str, Path], *, tokenizer: Any = None, title: Optional[str] = None) -> Path:
    """Write the decoding-order heatmap of ``out`` (a ``GenerationOutput`` with a trace) to ``path``
    (.png); returns the path. ``tokenizer``: label the rows with the prompts and, for answers of at
    most 32 positions, write each committed token into its cell."""
    steps = commit_steps(out)  # [B, G]
    path = check_png_path(path)
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError("plot_order needs matplotlib: pip install dllm[eval]") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows, cols = steps.shape
    values = np.ma.masked_less(steps.numpy().astype(float), 0)  # never committed: blank
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    top = max(int(steps.max()) if steps.numel() else 0, 1)

    fig, ax = plt.subplots(figsize=(min(max(6.0, 0.45 * cols + 3.5), 20.0), min(max(2.0, 0.45 * rows + 1.5), 14.0)))
    image = ax.imshow(values, cmap=cmap, vmin=0, vmax=top, aspect="auto", interpolation="nearest")
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("step")
    bar.locator = matplotlib.ticker.MaxNLocator(integer=True)
    bar.update_ticks()
    prompts = out.sequences[:, :out.prompt_length].tolist()
    ax.set_yticks(range(rows), [_row_label(tokenizer, ids, i) for i, ids in enumerate(prompts)], fontsize=8)
    ax.set_xlabel("generated position")
    if cols <= MAX_TEXT_POSITIONS:
        ax.set_xticks(range(cols))
    if tokenizer is not None and cols <= MAX_TEXT_POSITIONS:
        generated = out.sequences[:, out.prompt_length:].tolist()
        for r in range(rows):
            for c in range(cols):
                step = int(steps[r, c])
                if step < 0:
                    continue
                shade = cmap(step / top)
                light = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] > 0.5
                ax.text(c, r, _token_text(tokenizer, generated[r][c]), ha="center", va="center",
                        fontsize=7, color="black" if light else "white")
    ax.set_title(title or "decoding order", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["commit_steps", "plot_order", "check_png_path"]
