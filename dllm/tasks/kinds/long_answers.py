"""The long-answer suite: single-answer list tasks whose answers are 32-64 words.

Built for speculative decoding (``dllm.drafters``): a drafter can only pay when the answer is long
and predictable from the prompt, and these answers are fully determined by it (C(Y|X) = 0), so a
target that solves them emits long runs a good drafter can guess block by block.

==============  =========================================  ======================  ===========
task            answer                                     size n                  answer words
==============  =========================================  ======================  ===========
copy_long       the list                                   32..64 items            n
reverse_long    the list reversed                          32..64 items            n
double_long     every item twice, in order (A A B B ...)   16..32 items            2n
==============  =========================================  ======================  ===========

Items are the letters A-P drawn *with* replacement (a list of 32+ items must repeat letters; that
is what makes copying non-trivial: the next item is not a function of the current one). The
prompt is ``[BOS] <task> items... [SEP]``. The suite is ``"long-answer"``: default runs over the
PB-mini suite (``dllm compare``, the tiny-llada / tiny-dream recipes) do not include it, and the
models trained before it cannot read its task tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

from dllm.tasks.base import Meta, SingleAnswerTask, register
from dllm.tasks.vocab import ITEMS_1TOK

LONG_SUITE = "long-answer"
_OPS = {
    "copy": "repeat the list",
    "reverse": "the list in reverse order",
    "double": "every item twice, in order",
}


@dataclass(frozen=True, kw_only=True)
class LongListTask(SingleAnswerTask):
    op: str  # "copy" | "reverse" | "double"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.op not in _OPS:
            raise ValueError(f"long list op {self.op!r} is not one of {list(_OPS)}")

    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        return {"items": tuple(rng.choice(ITEMS_1TOK) for _ in range(size))}

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        return tuple(meta["items"])

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        bad = [w for w in args if w not in ITEMS_1TOK]
        if bad:
            raise ValueError(f"{self.name}: arguments must be items A-P, got {bad[:5]}")
        self.check_size(len(args))
        return {"items": tuple(args)}

    def size_of(self, meta: Meta) -> int:
        return len(meta["items"])

    def args_length(self, size: int) -> int:
        return size

    def content_length(self, size: int) -> int:
        return 2 * size if self.op == "double" else size

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        items = tuple(meta["items"])
        if self.op == "reverse":
            return items[::-1]
        if self.op == "double":
            return tuple(w for w in items for _ in range(2))
        return items


def _make(op: str, sizes: tuple[int, int], defaults: tuple[int, ...]) -> LongListTask:
    return LongListTask(name=f"{op}_long", description=f"{_OPS[op]} (items A-P with repeats; long answers)",
                        min_size=sizes[0], max_size=sizes[1], default_sizes=defaults,
                        size_meaning="list length n", op=op, suite=LONG_SUITE)


register(_make("copy", (32, 64), (32, 48, 64)))
register(_make("reverse", (32, 64), (32, 48, 64)))
register(_make("double", (16, 32), (16, 24, 32)))
