"""The PB-mini tokenizer: a word-level ``tokenizers`` tokenizer over :func:`vocabulary`.

Token ids equal vocabulary indices (``[PAD]`` = 0 doubles as the unknown token, so a prompt
with a word outside the vocabulary is a ValueError in ``DiffusionLM.generation_prompt`` rather
than silent padding), and ``word_id(w) == tokenizer.convert_tokens_to_ids(w)``. Words are matched
case-sensitively (items ``A``-``P`` are upper case) and not split further (``f0`` is one token).
Saved beside each tiny model as ``tokenizer.json`` and loaded through ``AutoTokenizer`` like
LLaDA's and Dream's.
"""

from __future__ import annotations

from typing import Any, Optional

from dllm.tasks.vocab import BOS, EOS, MASK, PAD, SPECIALS, vocabulary


def task_tokenizer(chat_template: Optional[str] = None, size: Optional[int] = None) -> Any:
    """A ``PreTrainedTokenizerFast`` for the task vocabulary (ids = vocabulary indices).

    size: keep only the first ``size`` words (the vocabulary is append-only, so a model trained
    before words were appended keeps its exact tokenizer: ``size=PB_MINI_VOCAB_SIZE`` = 80)."""
    from dllm.models.text.tokenizer import build_word_tokenizer

    full = vocabulary()
    if size is not None and not (isinstance(size, int) and len(SPECIALS) < size <= len(full)):
        raise ValueError(f"task_tokenizer size must be an int in ({len(SPECIALS)}, {len(full)}], got {size!r}")
    vocab_words = full[:size] if size is not None else full
    words = vocab_words[len(SPECIALS):]
    tok = build_word_tokenizer(
        words, list(SPECIALS), unk_token=PAD, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        mask_token=MASK, chat_template=chat_template, lowercase=False, split_digits=False,
    )
    vocab = tok.get_vocab()
    expected = {w: i for i, w in enumerate(vocab_words)}
    if any(vocab.get(w) != i for w, i in expected.items()):
        raise AssertionError("task tokenizer ids drifted from the vocabulary order")
    return tok
