"""``dllm generate --show``: the generated canvas redrawn in the terminal as positions get committed."""

from __future__ import annotations

import shutil
import sys


def screen_lines(text: str, columns: int) -> int:
    """The terminal lines ``text`` takes when its lines wrap at ``columns`` (an empty line takes one)."""
    columns = max(1, columns)
    return sum(max(1, -(-len(line) // columns)) for line in text.split("\n"))


class CanvasView:
    """A ``dllm.generate`` callback: one frame per step, rewritten in place on a terminal, appended otherwise."""

    MASK = "\u2591"

    def __init__(self, model, stream=None) -> None:
        self.model = model
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.lines = 0

    def render(self, state) -> str:
        tok = self.model.tokenizer
        ids = state.generated[0].tolist()
        pieces = []
        for t in ids:
            if t == state.mask_id:
                pieces.append(self.MASK)
            elif tok is not None:
                pieces.append(tok.convert_ids_to_tokens(t) or f"<{t}>")  # rows past the tokenizer
            else:
                pieces.append(str(t))
        return f"[step {state.step:3d} | nfe {state.nfe:3d}] " + " ".join(pieces)

    def __call__(self, state) -> None:
        text = self.render(state)
        if self.tty and self.lines:
            self.stream.write(f"\x1b[{self.lines}A\x1b[J")
        self.stream.write(text + "\n")
        self.stream.flush()
        self.lines = screen_lines(text, shutil.get_terminal_size().columns) if self.tty else 0
