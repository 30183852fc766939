"""Seeded generation, the pinned test split, hold-out, and prompt parsing."""

import hashlib
import random

import pytest

from dllm import tasks as T
from dllm.tasks.kinds.sudoku import solutions

ALL = T.tasks.names()

# SHA-256 of the first 3 prompts of a few test splits ("\n"-joined prompt_words). A change means
# every earlier test-split number is void: bump SPLIT_VERSION instead of editing these.
PINNED = {
    ("copy", 4): "3c6e4fe591f1214ac13dda9dc4cd3e257781d771c7135de8494e004eebd3d9ee",
    ("shuffle_2tok", 4): "57c14f9780b5d9ee8917aeb9b321f04d10e790457a2675e735383b394d553b51",
    ("sudoku4", 8): "ba006890817efc796726bc5af51c3b8a03968f6eb294ac5216b64cde4f8940fe",
    ("latin4_r1", 4): "a478370bb134175dfd8f40d2264ff1c5c722bceab0e3978491071fe3a99bc679",
    ("add_msb", 3): "be0972df048aaaccc754facfbf6c195ead909e4efaab489ad926ad0ad01c475d",
    ("pick_pair", 4): "2d3da2ff2935f7687baefed2542c3ce72328ad8336fe925f57d00681d5a8d474",
}


def _digest(examples):
    return hashlib.sha256("\n".join(" ".join(T.prompt_words(ex)) for ex in examples).encode()).hexdigest()


@pytest.mark.parametrize("name", ALL)
def test_generation_is_deterministic_under_a_seed(name):
    task = T.get_task(name)
    for size in task.default_sizes:
        a = [task.generate(random.Random(s), size) for s in range(5)]
        b = [task.generate(random.Random(s), size) for s in range(5)]
        assert a == b
    if name not in ("chain", "chain_must"):  # 9 prompts per size: collisions are expected there
        assert len({ex.prompt for ex in a}) > 1


@pytest.mark.parametrize(("name", "size"), sorted(PINNED))
def test_test_split_is_pinned(name, size):
    assert T.SPLIT_VERSION == "pbmini-v1"
    assert _digest(T.test_split(name, size, 3)) == PINNED[(name, size)]


def test_test_split_layout_and_seeds():
    split = T.test_split("shuffle")
    assert len(split) == 50 * len(T.get_task("shuffle").default_sizes)
    assert [ex.size for ex in split[::50]] == list(T.get_task("shuffle").default_sizes)
    assert T.test_split("copy", 6, 4) == T.test_split("copy", 6, 10)[:4]
    assert T.instance_seed("copy", 6, 0) == int.from_bytes(
        hashlib.sha256(b"pbmini-v1|copy|6|0").digest()[:8], "big")


def test_is_test_prompt_rejects_split_prompts_only():
    for ex in T.test_split("replace_random", 6, 50) + T.test_split("sort_num", 3, 5):
        assert T.is_test_prompt(ex)
    rng = random.Random(12345)
    fresh = [T.generate("copy", rng, 8) for _ in range(200)]
    assert sum(T.is_test_prompt(ex) for ex in fresh) <= 1
    # chain has only 9 prompts per length: nothing is held out
    assert not any(T.is_test_prompt(ex) for ex in T.test_split("chain", 4, 5))


@pytest.mark.parametrize("name", ALL)
def test_parse_prompt_round_trips(name):
    task = T.get_task(name)
    rng = random.Random(3)
    for size in task.sizes:
        ex = task.generate(rng, size)
        back = T.parse_prompt(T.prompt_words(ex))
        assert (back.task, back.size, back.prompt, back.meta) == (ex.task, ex.size, ex.prompt, ex.meta)
        assert T.score(back, T.target_words(back))
        if T.count_answers(ex) == 1:
            assert back.answer == ex.answer


def test_parse_prompt_errors():
    with pytest.raises(ValueError, match="a prompt must look like"):
        T.parse_prompt(["copy", "A", "B"])
    with pytest.raises(ValueError, match="repeats an item"):
        T.parse_prompt(["[BOS]", "copy", "A", "B", "A", "[SEP]"])
    with pytest.raises(ValueError, match=r"index '9' is not a digit in 1\.\.3"):
        T.parse_prompt(["[BOS]", "replace_index", "A", "B", "C", "|", "D", "|", "9", "[SEP]"])
    with pytest.raises(ValueError, match="has 4 solutions"):
        T.parse_prompt(["[BOS]", "sudoku4", *"1234341200000000", "[SEP]"])
    with pytest.raises(ValueError, match="size 2 is out of range"):
        T.parse_prompt(["[BOS]", "copy", "A", "B", "[SEP]"])


def test_2tok_problems_keep_parts_distinct():
    for name in ["replace_random_2tok", "insert_index_2tok", "shuffle_2tok"]:
        task = T.get_task(name)
        for ex in T.test_split(name, task.max_size, 20):
            items = list(ex.meta["items"]) + ([ex.meta["new"]] if "new" in ex.meta else [])
            assert len({it[0] for it in items}) == len({it[1] for it in items}) == len(items)


@pytest.mark.parametrize("clues", range(4, 13))
def test_sudoku_puzzles_have_a_unique_solution(clues):
    for ex in T.test_split("sudoku4", clues, 20):
        puzzle = ex.meta["puzzle"]
        assert sum(1 for v in puzzle if v) == clues == ex.size
        assert len(solutions(puzzle)) == 1
        assert all(p in (0, s) for p, s in zip(puzzle, ex.meta["solution"]))
        assert T.valid_answers(ex) == [T.target_words(ex)]


def test_multi_answer_targets_are_drawn_uniformly():
    # training targets must follow the uniform answer distribution the oracle assumes
    task, rng = T.get_task("replace_random"), random.Random(0)
    ex = task.generate(rng, 4)
    hits = [0] * 4
    for _ in range(4000):
        answer = task.sample_answer(rng, ex.meta)
        hits[answer.index(ex.meta["new"][0])] += 1
    assert all(800 < h < 1200 for h in hits)
