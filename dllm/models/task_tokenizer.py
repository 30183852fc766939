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


def task_tokenizer(chat_template: Optional[str] = None) -> Any:
    """A ``PreTrainedTokenizerFast`` for the task vocabulary (ids = vocabulary indices)."""
    from dllm.models.tokenizer import build_word_tokenizer

    words = vocabulary()[len(SPECIALS):]
    tok = build_word_tokenizer(
        words, list(SPECIALS), unk_token=PAD, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        mask_token=MASK, chat_template=chat_template, lowercase=False, split_digits=False,
    )
    vocab = tok.get_vocab()
    expected = {w: i for i, w in enumerate(vocabulary())}
    if any(vocab.get(w) != i for w, i in expected.items()):
        raise AssertionError("task tokenizer ids drifted from the vocabulary order")
    return tok
