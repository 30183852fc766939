"""PB-mini: synthetic stress tasks with exact answers for parallel decoding (no torch needed).

Every task is a registered :class:`Task` (``tasks`` registry, ``get_task(name)``). Sequences are
``[BOS] <task> <args...> [SEP] <answer...> [EOS]*`` over the fixed word :func:`vocabulary`; the
answer region has ``answer_length(task, size)`` = max answer length + 1 words, EOS-padded.

Decisions worth knowing (see each module for details):

- Indices are **1-based** digits. Prompt argument groups are separated by ``|``.
- Two-token ("2tok") list tasks are separate registered names ``<op>_2tok`` with their own task
  token; ``sort_num`` sorts two-digit numbers; ``shuffle_strict`` excludes the input order.
- ``sort`` key: the item table order A < B < ... < P; 2tok by first part then second; numbers by
  value.
- ``generate`` draws multi-answer targets **uniformly** from the valid answers, which is the
  distribution the oracle marginals and C(Y|X) assume; ``parse_prompt`` rebuilds the problem and
  returns a deterministic reference answer instead.
- ``score`` takes the generated answer region (words after ``[SEP]``): cut at the first EOS, only
  EOS may follow, then the task's exact validity rule.
- ``marginals(ex, committed)`` (answer position -> word) gives, per answer position, the word
  distribution over the consistent valid answers, or ``None`` if there is none; ``chain`` uses
  exact counting, every other task filters an enumerated answer table.
- Suites: ``pb-mini`` (the default of every run that takes no task list), ``long-answer``
  (``long_answers.py``: 32-64-word answers for speculative decoding) and ``long-prompt``
  (``long_prompt.py``: 256-2,045-word prompts with 2-4-word answers, for KV-cache approximations);
  ``suite_task_names(suite)``.
- Test split: ``test_split(task, size=None, n=50)``, seeds from SHA-256 of
  ``"{SPLIT_VERSION}|{task}|{size}|{i}"``; ``is_test_prompt`` lets training drop held-out prompts
  (``chain`` tasks hold nothing out: their prompt space is tiny).
"""

from dllm.tasks.kinds import arithmetic as _arithmetic  # noqa: F401  (registration side effects)
from dllm.tasks.kinds import chain as _chain  # noqa: F401
from dllm.tasks.kinds import latin as _latin  # noqa: F401
from dllm.tasks.kinds import lists as _lists  # noqa: F401
from dllm.tasks.kinds import long_answers as _long_answers  # noqa: F401
from dllm.tasks.kinds import long_prompt as _long_prompt  # noqa: F401
from dllm.tasks.kinds import pick_pair as _pick_pair  # noqa: F401
from dllm.tasks.kinds import sudoku as _sudoku  # noqa: F401
from dllm.tasks.answers import Marginals, entropy_bits
from dllm.tasks.api import (
    count_answers, generate, is_valid_answer, item_integrity, marginals, parse_prompt, score,
    total_correlation, valid_answers,
)  # fmt: skip
from dllm.tasks.base import ENUMERATION_LIMIT, Example, Task, TooManyAnswersError, get_task, tasks
from dllm.tasks.format import (
    answer_length, cut_answer, max_sequence_length, prompt_ids, prompt_length, prompt_words, sequence_length,
    sequence_words, split_sequence, target_words,
)  # fmt: skip
from dllm.tasks.split import SPLIT_VERSION, TEST_SPLIT_SIZE, instance_seed, is_test_prompt, test_split
from dllm.tasks.vocab import BOS, EOS, MASK, PAD, PB_MINI_VOCAB_SIZE, SEP, SPECIALS, vocabulary, word_id, words_of

PB_MINI = "pb-mini"  # the default suite: every task the diffusion models were trained and measured on
SUITES: tuple[str, ...] = (PB_MINI, _long_answers.LONG_SUITE, _long_prompt.LONG_PROMPT_SUITE)


def suite_task_names(suite: str = PB_MINI) -> tuple[str, ...]:
    """Registered task names of one suite, in registry order (``SUITES``)."""
    if suite not in SUITES:
        raise ValueError(f"unknown task suite {suite!r}; valid suites: {list(SUITES)}")
    return tuple(e.name for e in tasks if e.obj.suite == suite)


def list_tasks() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered task."""
    return [(e.name, e.description) for e in tasks]


__all__ = [
    "BOS", "ENUMERATION_LIMIT", "PB_MINI", "PB_MINI_VOCAB_SIZE", "SUITES", "suite_task_names", "EOS", "Example", "MASK", "Marginals", "PAD", "SEP", "SPECIALS",
    "SPLIT_VERSION", "TEST_SPLIT_SIZE", "Task", "TooManyAnswersError", "answer_length",
    "count_answers", "cut_answer", "entropy_bits", "generate", "get_task", "instance_seed",
    "is_test_prompt", "is_valid_answer", "item_integrity", "list_tasks", "marginals",
    "max_sequence_length", "parse_prompt", "prompt_ids", "prompt_length", "prompt_words", "score",
    "sequence_length", "sequence_words", "split_sequence", "target_words", "tasks", "test_split",
    "total_correlation", "valid_answers", "vocabulary", "word_id", "words_of",
]  # fmt: skip
