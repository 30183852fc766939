"""Exact scorers: every valid answer passes, near-misses fail, the EOS cut is strict."""

import random

import pytest

from dllm import tasks as T

ALL = T.tasks.names()
EOS = "[EOS]"


def _examples(name, per_size=2, seed=11):
    task, rng = T.get_task(name), random.Random(seed)
    sizes = sorted({task.min_size, *task.default_sizes})
    return [task.generate(rng, s) for s in sizes for _ in range(per_size)]


def test_cut_answer():
    assert T.cut_answer(["A", "B", EOS, EOS]) == ("A", "B")
    assert T.cut_answer([EOS]) == ()
    assert T.cut_answer(["A", "B"]) is None  # no EOS
    assert T.cut_answer(["A", EOS, "B"]) is None  # junk after EOS
    assert T.cut_answer(["A", EOS, "[PAD]"]) is None


def test_split_sequence():
    ex = T.test_split("copy", 4, 1)[0]
    prompt, region = T.split_sequence(T.sequence_words(ex))
    assert prompt == T.prompt_words(ex) and region == T.target_words(ex)
    with pytest.raises(ValueError, match="no \\[SEP\\]"):
        T.split_sequence(["[BOS]", "copy"])


@pytest.mark.parametrize("name", ALL)
def test_scorer_accepts_every_valid_answer(name):
    for ex in _examples(name):
        target = T.target_words(ex)
        assert T.score(ex, target)
        assert T.score(ex, target + (EOS, EOS))  # a longer region of pure EOS is fine
        assert T.is_valid_answer(ex, ex.answer)
        if T.count_answers(ex) > 5000:
            continue
        answers = T.valid_answers(ex)
        assert len(answers) == len(set(answers)) == T.count_answers(ex)
        assert target in answers
        assert T.target_words(T.parse_prompt(T.prompt_words(ex))) in answers  # reference answer
        assert all(T.score(ex, a) for a in answers)


@pytest.mark.parametrize("name", ALL)
def test_scorer_rejects_format_near_misses(name):
    for ex in _examples(name):
        target, ans = T.target_words(ex), ex.answer
        assert not T.score(ex, ans)  # missing EOS
        assert not T.score(ex, ans[:-1] + (EOS, EOS))  # one word short
        assert not T.score(ex, target + ("A",))  # junk after EOS
        assert not T.score(ex, ans + (ans[-1], EOS))  # one word long
        assert not T.score(ex, ans[:-1] + ("[MASK]", EOS))
        assert not T.score(ex, (EOS,) * len(target))


@pytest.mark.parametrize("name", ALL)
def test_scorer_agrees_with_the_enumeration_on_mutants(name):
    """Random one- and two-word edits of valid answers score True iff they are enumerated."""
    rng = random.Random(5)
    words = [w for w in T.vocabulary() if w not in ("[PAD]", "[MASK]", "[BOS]", "[SEP]")]
    for ex in _examples(name, per_size=1):
        if T.count_answers(ex) > 5000:
            continue
        answers = set(T.valid_answers(ex))
        base = list(T.target_words(ex))
        for _ in range(150):
            out = list(base)
            if rng.random() < 0.5:  # swap two answer positions
                i, j = rng.sample(range(len(ex.answer)), 2)
                out[i], out[j] = out[j], out[i]
            else:  # overwrite one position with a word seen in the prompt or anywhere
                i = rng.randrange(len(ex.answer))
                out[i] = rng.choice(list(ex.prompt) + words)
            assert T.score(ex, out) == (tuple(out) in answers), (ex, out)


@pytest.mark.parametrize("name", [n for n in ALL if n.endswith("_2tok")] + ["pick_pair"])
def test_two_token_items_swapped_halves_and_chimeras_fail(name):
    for ex in _examples(name):
        target = list(T.target_words(ex))
        swapped = [target[1], target[0]] + target[2:]
        assert not T.score(ex, swapped)
        assert T.item_integrity(ex, target) is True
        assert T.item_integrity(ex, swapped) is False
        if len(ex.answer) >= 4:  # chimera: exchange the second parts of the first two items
            chimera = [target[0], target[3], target[2], target[1]] + target[4:]
            assert not T.score(ex, chimera)
            assert T.item_integrity(ex, chimera) is False
        assert T.item_integrity(ex, ex.answer) is False  # unreadable (no EOS)


def test_item_integrity_is_none_without_two_token_items():
    ex = T.test_split("shuffle", 4, 1)[0]
    assert T.item_integrity(ex, T.target_words(ex)) is None


def test_list_rules_by_hand():
    ex = T.parse_prompt(["[BOS]", "insert_index", "A", "B", "C", "|", "D", "|", "4", "[SEP]"])
    assert ex.answer == ("A", "B", "C", "D")  # slot n+1 appends (1-based)
    ex = T.parse_prompt(["[BOS]", "insert_index", "A", "B", "C", "|", "D", "|", "1", "[SEP]"])
    assert ex.answer == ("D", "A", "B", "C")
    ex = T.parse_prompt(["[BOS]", "replace_index", "A", "B", "C", "|", "D", "|", "2", "[SEP]"])
    assert ex.answer == ("A", "D", "C")
    ex = T.parse_prompt(["[BOS]", "remove_random", "A", "B", "C", "[SEP]"])
    assert T.score(ex, ["A", "C", EOS, EOS]) and not T.score(ex, ["C", "A", EOS, EOS])
    ex = T.parse_prompt(["[BOS]", "sort_2tok", "f2", "s0", "f0", "s3", "f1", "s1", "[SEP]"])
    assert ex.answer == ("f0", "s3", "f1", "s1", "f2", "s0")
    ex = T.parse_prompt(["[BOS]", "sort_num", "4", "2", "1", "7", "3", "9", "[SEP]"])
    assert ex.answer == ("1", "7", "3", "9", "4", "2")
    ex = T.parse_prompt(["[BOS]", "shuffle_strict", "A", "B", "C", "[SEP]"])
    assert not T.score(ex, ["A", "B", "C", EOS]) and T.score(ex, ["B", "A", "C", EOS])
    assert T.count_answers(ex) == 5


def test_arithmetic_and_chain_by_hand():
    ex = T.parse_prompt(["[BOS]", "add_msb", "9", "9", "|", "1", "2", "[SEP]"])
    assert ex.answer == ("1", "1", "1")
    ex = T.parse_prompt(["[BOS]", "add_lsb", "9", "9", "|", "2", "1", "[SEP]"])  # 99 + 12
    assert ex.answer == ("1", "1", "1")
    ex = T.parse_prompt(["[BOS]", "add_lsb", "5", "1", "|", "5", "1", "[SEP]"])  # 15 + 15 = 030
    assert ex.answer == ("0", "3", "0")
    ex = T.parse_prompt(["[BOS]", "cumsum", "7", "5", "9", "[SEP]"])
    assert ex.answer == ("7", "2", "1")
    ex = T.parse_prompt(["[BOS]", "chain", "3", "|", "2", "[SEP]"])
    assert T.score(ex, ["3", "9", "9", "1", EOS]) and not T.score(ex, ["3", "9", "8", "1", EOS])
    assert not T.score(ex, ["4", "9", "9", "1", EOS]) and not T.score(ex, ["3", "0", "0", "1", EOS])
    ex = T.parse_prompt(["[BOS]", "chain_must", "3", "|", "2", "|", "5", "[SEP]"])
    assert T.score(ex, ["3", "5", "5", "1", EOS]) and not T.score(ex, ["3", "9", "9", "1", EOS])


def test_latin_rules_by_hand():
    ex = T.parse_prompt(["[BOS]", "latin4", "A", "B", "C", "D", "[SEP]"])
    square = "A B C D B A D C C D A B D C B A".split()
    assert T.score(ex, square + [EOS])
    bad = list(square)
    bad[0], bad[1] = bad[1], bad[0]  # rows still permutations, columns not
    assert not T.score(ex, bad + [EOS])
    ex = T.parse_prompt(["[BOS]", "latin4_r1", "A", "B", "C", "D", "|", "B", "A", "D", "C", "[SEP]"])
    assert not T.score(ex, square + [EOS])  # a Latin square, but not the given first row
