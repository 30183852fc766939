"""Registry, vocabulary, sizes and the sequence-length budget of the PB-mini tasks."""

import hashlib
import random

import pytest

from dllm import tasks as T
from dllm.registry import UnknownNameError

REQUIRED = [
    "copy", "reverse", "sort", "replace_index", "replace_random", "insert_index", "insert_random",
    "remove_index", "remove_random", "shuffle", "pick_pair", "sudoku4", "latin4", "latin4_r1",
    "add_lsb", "add_msb", "chain",
]  # fmt: skip
ALL = T.tasks.names()

# sha256 of "\n".join(vocabulary()): token ids are part of every checkpoint. Append-only!
VOCAB_SHA256 = "d1b921e1cab9b29bc0a0f52b7f575552c8e5026d91d3eb560255dcc8b0215f4c"
# ... and of its first 80 words, the vocabulary tiny-llada / tiny-dream were trained on (2026-11)
PB_MINI_SHA256 = "49b2a5dfa9313e46c242ca11733e73d5947b4dde13e8e23a6dd976214ff2c8af"


def test_required_tasks_and_2tok_variants_are_registered():
    for name in REQUIRED:
        assert name in T.tasks
    for op in ["copy", "reverse", "sort", "replace_random", "insert_random", "remove_random", "shuffle"]:
        assert f"{op}_2tok" in T.tasks
    assert T.get_task("latin4-r1") is T.get_task("latin4_r1")
    assert dict(T.list_tasks())["copy"]


def test_unknown_task_lists_valid_names():
    with pytest.raises(UnknownNameError, match=r"Unknown task 'shufle'\. Valid tasks: .*shuffle"):
        T.get_task("shufle")
    with pytest.raises(KeyError):
        T.test_split("nope")


@pytest.mark.parametrize("name", ["copy", "sudoku4", "chain", "latin4", "add_msb", "shuffle_2tok"])
def test_bad_size_names_size_and_range(name):
    task = T.get_task(name)
    for bad in (task.min_size - 1, task.max_size + 1):
        with pytest.raises(ValueError, match=rf"size {bad} .*{name}.*valid sizes: {task.min_size}\.\.{task.max_size}"):
            task.generate(random.Random(0), bad)
        with pytest.raises(ValueError, match=rf"size {bad}"):
            T.answer_length(name, bad)
        with pytest.raises(ValueError, match=rf"size {bad}"):
            T.test_split(name, bad, 1)


def test_vocabulary_is_small_unique_and_pinned():
    vocab = T.vocabulary()
    assert vocab[:5] == ["[PAD]", "[MASK]", "[BOS]", "[SEP]", "[EOS]"]
    assert len(vocab) == len(set(vocab)) <= 100
    assert hashlib.sha256("\n".join(vocab).encode()).hexdigest() == VOCAB_SHA256
    pb_mini = vocab[:T.PB_MINI_VOCAB_SIZE]  # appending kept every earlier id
    assert hashlib.sha256("\n".join(pb_mini).encode()).hexdigest() == PB_MINI_SHA256
    assert T.word_id("[EOS]") == 4
    with pytest.raises(ValueError, match="'zz' is not in the PB-mini vocabulary"):
        T.word_id("zz")


def test_every_task_has_its_own_token():
    vocab = T.vocabulary()
    for name in ALL:
        assert name in vocab, f"task {name} has no task token"


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
@pytest.mark.parametrize("name", ALL)
def test_lengths_fit_the_budget_at_every_size(name):
    task = T.get_task(name)
    assert task.description and task.default_sizes
    budget = {T.PB_MINI: 64, "long-answer": 132, "long-prompt": 2048}[task.suite]  # long-prompt: max_positions
    assert T.max_sequence_length(name) <= budget
    vocab = set(T.vocabulary())
    rng = random.Random(7)
    for size in task.sizes:
        for _ in range(3):
            ex = task.generate(rng, size)
            seq = T.sequence_words(ex)
            assert len(T.prompt_words(ex)) == T.prompt_length(name, size)
            assert len(T.target_words(ex)) == T.answer_length(name, size) == task.content_length(size) + 1
            assert len(seq) == T.sequence_length(name, size) <= budget
            assert set(seq) <= vocab
            assert "[MASK]" not in seq and "[PAD]" not in seq


def test_suites_split_the_registry_and_the_long_answers_are_32_to_64_words():
    long = T.suite_task_names("long-answer")
    assert set(long) == {"copy_long", "reverse_long", "double_long"}
    assert set(long).isdisjoint(T.suite_task_names()) and len(T.suite_task_names()) == 31
    assert set(long) | set(T.suite_task_names()) | set(T.suite_task_names("long-prompt")) == set(ALL)
    for name in long:
        task = T.get_task(name)
        lengths = {task.content_length(s) for s in task.default_sizes}
        assert min(lengths) == 32 and max(lengths) == 64
        for ex in T.test_split(name, None, n=3):
            assert T.score(ex, [*ex.answer, "[EOS]"]) and T.total_correlation(ex) == 0.0
    ex = T.test_split("double_long", 16, n=1)[0]
    assert ex.answer == tuple(w for w in ex.prompt for _ in range(2))
    with pytest.raises(ValueError, match="unknown task suite 'nope'"):
        T.suite_task_names("nope")


def test_words_of_maps_ids_and_reads_unknown_ids_as_pad():
    ids = [T.word_id("A"), T.word_id(T.EOS), len(T.vocabulary()), -1]
    assert T.words_of(ids) == ["A", T.EOS, T.PAD, T.PAD]


@pytest.mark.parametrize("n", [-1, 2.0, True, "3"])
def test_test_split_refuses_a_bad_instance_count(n):
    # a negative count used to return [] silently (an evaluation of nothing); a float or string crashed
    # inside range() without naming the argument
    with pytest.raises(ValueError, match=r"n must be an integer >= 0.*got"):
        T.test_split("copy", 4, n=n)
    assert len(T.test_split("copy", 4, n=0)) == 0 and len(T.test_split("copy", 4, n=2)) == 2
