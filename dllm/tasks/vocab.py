"""The PB-mini word vocabulary: one fixed, append-only list.

A tokenizer is built from :func:`vocabulary` and checkpoints store ids, so the order below is part
of the on-disk format. **Never reorder or remove a word; append new words at the end** (after the
separators), and bump nothing else. ``tests/eval`` pins a SHA-256 of the list to catch accidents.

Layout (ids in this order): specials, one token per task (the task's registry name), digits
``0``-``9``, single-token items ``A``-``P``, first parts ``f0``-``f7``, second parts ``s0``-``s7``,
separators ``,`` and ``|``, then the task tokens of the long-answer suite (appended later: the
models trained before them embed only the first ``PB_MINI_VOCAB_SIZE`` = 80 words), then those of
the long-prompt suite (``LONG_ANSWER_VOCAB_SIZE`` = 83 words come before them).
"""

from __future__ import annotations

from functools import lru_cache

PAD, MASK, BOS, SEP, EOS = "[PAD]", "[MASK]", "[BOS]", "[SEP]", "[EOS]"
SPECIALS: tuple[str, ...] = (PAD, MASK, BOS, SEP, EOS)

# One word per registered task; the word is the task's canonical registry name.
TASK_TOKENS: tuple[str, ...] = (
    "copy", "reverse", "sort", "sort_num",
    "replace_index", "replace_random", "insert_index", "insert_random",
    "remove_index", "remove_random", "shuffle", "shuffle_strict",
    "copy_2tok", "reverse_2tok", "sort_2tok",
    "replace_index_2tok", "replace_random_2tok", "insert_index_2tok", "insert_random_2tok",
    "remove_index_2tok", "remove_random_2tok", "shuffle_2tok",
    "pick_pair", "sudoku4", "latin4", "latin4_r1", "add_lsb", "add_msb", "chain", "chain_must",
    "cumsum",
)  # fmt: skip

DIGITS: tuple[str, ...] = tuple(str(d) for d in range(10))
ITEMS_1TOK: tuple[str, ...] = tuple("ABCDEFGHIJKLMNOP")  # sort key: this order (A < B < ... < P)
FIRST_PARTS: tuple[str, ...] = tuple(f"f{i}" for i in range(8))
SECOND_PARTS: tuple[str, ...] = tuple(f"s{i}" for i in range(8))
COMMA, BAR = ",", "|"  # "|" separates argument groups in prompts; "," is reserved (unused so far)
SEPARATORS: tuple[str, ...] = (COMMA, BAR)

# appended 2026-12-01: the long-answer suite's task tokens (``dllm/tasks/long_answers.py``)
LONG_TASK_TOKENS: tuple[str, ...] = ("copy_long", "reverse_long", "double_long")

# appended 2026-12-01 (later): the long-prompt suite's task tokens (``dllm/tasks/long_prompt.py``; its
# prompts use "," as a row separator / span marker, no other new word)
LONG_PROMPT_TASK_TOKENS: tuple[str, ...] = ("lookup_long", "lookup_any", "span_copy_far", "count_long")

_VOCABULARY: tuple[str, ...] = (
    SPECIALS + TASK_TOKENS + DIGITS + ITEMS_1TOK + FIRST_PARTS + SECOND_PARTS + SEPARATORS + LONG_TASK_TOKENS
    + LONG_PROMPT_TASK_TOKENS
)
# the words before the long-answer tokens: tiny-llada / tiny-dream embed exactly these 80
PB_MINI_VOCAB_SIZE = len(_VOCABULARY) - len(LONG_TASK_TOKENS) - len(LONG_PROMPT_TASK_TOKENS)
# ... and before the long-prompt tokens: the 83 words of tiny-ar / tiny-ar-dflash's tokenizer
LONG_ANSWER_VOCAB_SIZE = PB_MINI_VOCAB_SIZE + len(LONG_TASK_TOKENS)


def vocabulary() -> list[str]:
    """All words, specials first; the index of a word is its token id. Append-only."""
    return list(_VOCABULARY)


@lru_cache(maxsize=None)
def _ids() -> dict[str, int]:
    return {w: i for i, w in enumerate(_VOCABULARY)}


def words_of(ids) -> list[str]:
    """Generated token ids -> words; an id outside the vocabulary (a model with a larger embedding)
    reads as ``PAD``, which no answer contains."""
    return [_VOCABULARY[t] if 0 <= t < len(_VOCABULARY) else PAD for t in ids]


def word_id(word: str) -> int:
    """Token id of ``word``; ``ValueError`` naming the word if it is not in the vocabulary."""
    try:
        return _ids()[word]
    except KeyError:
        raise ValueError(
            f"word {word!r} is not in the PB-mini vocabulary ({len(_VOCABULARY)} words: "
            f"specials {list(SPECIALS)}, task tokens, digits 0-9, items A-P, f0-f7, s0-s7, ',' '|')"
        ) from None
