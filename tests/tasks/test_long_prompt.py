"""The long-prompt suite (``dllm/tasks/long_prompt.py``): lengths, scorers, C(Y|X), the oracle, and
that adding it left the PB-mini and long-answer suites, their vocabulary ids and splits unchanged."""

import hashlib
import math
import random

import pytest

import dllm
from dllm import tasks as T
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.tasks.kinds.long_prompt import MAX_COUNT, SPAN, key_words, two_digits

LONG_PROMPT = ("count_long", "lookup_any", "lookup_long", "span_copy_far")
C_ZERO = ("count_long", "lookup_long", "span_copy_far")
EOS = "[EOS]"

# pinned before the suite existed (HEAD 52ea64f): the default suite and every earlier token id
PB_MINI_TASKS = (
    "add_lsb", "add_msb", "chain", "chain_must", "copy", "copy_2tok", "cumsum", "insert_index",
    "insert_index_2tok", "insert_random", "insert_random_2tok", "latin4", "latin4_r1", "pick_pair",
    "remove_index", "remove_index_2tok", "remove_random", "remove_random_2tok", "replace_index",
    "replace_index_2tok", "replace_random", "replace_random_2tok", "reverse", "reverse_2tok", "shuffle",
    "shuffle_2tok", "shuffle_strict", "sort", "sort_2tok", "sort_num", "sudoku4",
)  # fmt: skip
VOCAB_80_SHA256 = "49b2a5dfa9313e46c242ca11733e73d5947b4dde13e8e23a6dd976214ff2c8af"  # tiny-llada / tiny-dream
VOCAB_83_SHA256 = "e7450be12e78f3e13a7904fa517981f952e46687b9830f05fd8e3325711c4c91"  # + long-answer (tiny-ar)
OLD_SPLITS = {  # first 3 prompts of a few earlier test splits (as tests/tasks/test_generation.py)
    ("copy", 4): "3c6e4fe591f1214ac13dda9dc4cd3e257781d771c7135de8494e004eebd3d9ee",
    ("pick_pair", 4): "2d3da2ff2935f7687baefed2542c3ce72328ad8336fe925f57d00681d5a8d474",
}
NEW_SPLITS = {  # ... and of this suite's (a change voids every long-prompt number: bump SPLIT_VERSION)
    ("lookup_long", 42): "3899f7c01c05c079b3a9bb381b5ac12f4dd17681fd50c0389bf972662e9d81fe",
    ("lookup_any", 85): "b96f5bee888af909d3855aa4d4ff775794343f0564a10b3d2874f9cde7128c5a",
    ("span_copy_far", 252): "b3683e4b2439f446f7dd4e5bac4bf56eb1f15535c6c624b02da29c8209a5c394",
    ("count_long", 251): "6f2d804a244847bb4a3da64736419db424562fead5e7ad701bdd1ea08896c5a3",
}


def _digest(examples):
    return hashlib.sha256("\n".join(" ".join(T.prompt_words(ex)) for ex in examples).encode()).hexdigest()


def _sha(words):
    return hashlib.sha256("\n".join(words).encode()).hexdigest()


def test_the_suite_is_appended_and_the_earlier_suites_are_unchanged():
    assert T.suite_task_names("long-prompt") == LONG_PROMPT and T.SUITES[2] == "long-prompt"
    assert T.suite_task_names() == PB_MINI_TASKS
    assert T.suite_task_names("long-answer") == ("copy_long", "double_long", "reverse_long")
    vocab = T.vocabulary()
    assert T.PB_MINI_VOCAB_SIZE == 80 and _sha(vocab[:80]) == VOCAB_80_SHA256
    assert _sha(vocab[:83]) == VOCAB_83_SHA256
    assert vocab[83:] == ["lookup_long", "lookup_any", "span_copy_far", "count_long"]
    for key, digest in OLD_SPLITS.items():
        assert _digest(T.test_split(*key, 3)) == digest


@pytest.mark.parametrize(("name", "size"), sorted(NEW_SPLITS))
def test_test_split_is_pinned_and_nothing_is_held_out(name, size):
    split = T.test_split(name, size, 3)
    assert _digest(split) == NEW_SPLITS[(name, size)]
    assert not any(T.is_test_prompt(ex) for ex in split)  # holdout=False: prompts never repeat


@pytest.mark.parametrize("name", LONG_PROMPT)
def test_generation_is_deterministic_and_prompts_are_256_to_2048_words(name):
    task = T.get_task(name)
    lengths = [T.prompt_length(name, s) for s in task.sizes]
    assert min(lengths) <= 40 and 2040 <= max(lengths) <= 2045  # short sizes: the training curriculum
    assert max(T.sequence_length(name, s) for s in task.sizes) <= 2048  # the models' max_positions
    defaults = [T.prompt_length(name, s) for s in task.default_sizes]
    assert defaults in ([256, 512, 1024, 2040], [258, 516, 1026, 2040])
    assert 2 <= task.content_length(task.min_size) <= 4
    for size in (task.min_size, task.max_size):
        a = [task.generate(random.Random(s), size) for s in range(3)]
        assert a == [task.generate(random.Random(s), size) for s in range(3)]
        assert len({ex.prompt for ex in a}) == 3
        for ex in a:
            assert len(T.prompt_words(ex)) == T.prompt_length(name, size)
            assert set(T.sequence_words(ex)) <= set(T.vocabulary())


@pytest.mark.parametrize("name", LONG_PROMPT)
def test_parse_prompt_round_trips(name):
    task = T.get_task(name)
    rng = random.Random(4)
    for size in (task.min_size, *task.default_sizes, task.max_size):
        ex = task.generate(rng, size)
        back = T.parse_prompt(T.prompt_words(ex))
        assert (back.task, back.size, back.prompt, back.meta) == (ex.task, ex.size, ex.prompt, ex.meta)
        assert T.score(back, T.target_words(back)) and T.is_valid_answer(ex, back.answer)


def test_answers_by_hand():
    table = _table(42, {5: ("P", "B", "B", "3", "4")})
    ex = T.parse_prompt(["[BOS]", "lookup_long", *table, "|", "P", "B", "B", "[SEP]"])
    assert ex.answer == ("3", "4") and ex.size == 42 and table[30:36] == ["P", "B", "B", "3", "4", ","]
    items = list("ABCDEFGHIJKLMNOP" * 16)[:252]
    ex = T.parse_prompt(["[BOS]", "span_copy_far", *items[:7], ",", *items[7:], "[SEP]"])
    assert ex.answer == ("H", "I", "J", "K")
    ex = T.parse_prompt(["[BOS]", "count_long", *items[:251], "|", "C", "[SEP]"])
    assert ex.answer == ("1", "6") and items[:251].count("C") == 16
    assert key_words(0) == ("A", "A", "A") and key_words(4095) == ("P", "P", "P")
    assert len({key_words(k) for k in range(4096)}) == 4096 and two_digits(7) == ("0", "7")
    with pytest.raises(ValueError, match="value 100 does not fit two digits"):
        two_digits(100)


def _table(n, special):
    """n unique-key rows (keys A A A, A A B, ...; value 0 0), with rows replaced by ``special``."""
    out = []
    for i in range(n):
        row = special.get(i, (*key_words(i), "0", "0"))
        out += ([","] if i else []) + list(row)
    return out


@pytest.mark.parametrize(("args", "match"), [
    (_table(42, {3: (*key_words(7), "1", "1")}) + ["|", *key_words(9)], "a key other than the query appears"),
    (_table(42, {}) + ["|", "P", "P", "P"], "has 0 rows, expected 1..1"),
    (_table(42, {}) + ["|", "A", "A"], "the query key has 2 words"),
    (_table(42, {1: ("A", "A", "B", "1")}) + ["|", "A", "A", "A"], "row 2 'A A B 1' is not"),
    (_table(3, {}) + ["|", "A", "A", "A"], "size 3 is out of range"),
])
def test_lookup_long_refuses_malformed_tables(args, match):
    with pytest.raises(ValueError, match=match):
        T.parse_prompt(["[BOS]", "lookup_long", *args, "[SEP]"])


def test_lookup_any_needs_2_to_4_rows_with_distinct_digits():
    q = key_words(100)
    ok = _table(42, {3: (*q, "1", "2"), 30: (*q, "3", "4")}) + ["|", *q]
    ex = T.parse_prompt(["[BOS]", "lookup_any", *ok, "[SEP]"])
    assert T.valid_answers(ex) == [("1", "2", EOS), ("3", "4", EOS)]
    same_first = _table(42, {3: (*q, "1", "2"), 30: (*q, "1", "4")}) + ["|", *q]
    with pytest.raises(ValueError, match=r"values \['12', '14'\] repeat a first or a second digit"):
        T.parse_prompt(["[BOS]", "lookup_any", *same_first, "[SEP]"])
    with pytest.raises(ValueError, match="has 1 rows, expected 2..4"):
        T.parse_prompt(["[BOS]", "lookup_any", *_table(42, {3: (*q, "1", "2")}), "|", *q, "[SEP]"])


@pytest.mark.parametrize(("name", "args", "match"), [
    ("span_copy_far", list("AB" * 126), "exactly one ',' marker, found 0"),
    ("span_copy_far", ["A", ","] + list("AB" * 125) + [",", "A"], "exactly one ',' marker, found 2"),
    ("span_copy_far", list("AB" * 125) + ["A", ",", "B", "A", "B"], "followed by 3 items"),
    ("span_copy_far", ["A", ",", "3"] + list("AB" * 125), r"must be items A-P, got \['3'\]"),
    ("count_long", list("AB" * 126), "expected '<items> | <query item>'"),
    ("count_long", list("AB" * 126) + ["|", "A", "B"], "and 2 query words"),
    ("count_long", list("A" * 251) + ["|", "A"], "occurs 251 times"),
])
def test_list_tasks_refuse_malformed_prompts(name, args, match):
    with pytest.raises(ValueError, match=match):
        T.parse_prompt(["[BOS]", name, *args, "[SEP]"])


def _near_misses(ex):
    """Wrong answers a model could plausibly give: other rows' values, shifted spans, counts +-1."""
    meta, out = ex.meta, []
    if ex.task.startswith("lookup"):
        out += [v for k, v in meta["rows"] if k != meta["query"]][:20]
        vals = T.get_task(ex.task).enumerate_answers(meta)
        out += [(a[0], b[1]) for a in vals for b in vals if a != b]  # chimeras of two valid values
        out += [(v[1], v[0]) for v in vals if v[0] != v[1]]
    elif ex.task == "span_copy_far":
        s, items = meta["start"], meta["items"]
        out += [tuple(items[s + d:s + d + SPAN]) for d in (-1, 1) if s + d >= 0]
        out += [ex.answer[:-1], ex.answer + ("A",)]
    else:
        c = int("".join(ex.answer))
        out += [two_digits(c - 1), two_digits(c + 1), (str(c),) if c < 10 else ex.answer[::-1]]
    return [w for w in out if w not in T.get_task(ex.task).enumerate_answers(meta)]


@pytest.mark.parametrize("name", LONG_PROMPT)
def test_scorer_accepts_the_answers_and_rejects_near_misses(name):
    for ex in T.test_split(name, None, 4):
        length = T.answer_length(name, ex.size)
        for answer in T.get_task(name).enumerate_answers(ex.meta):
            assert T.score(ex, answer + (EOS,) * (length - len(answer)))
        misses = _near_misses(ex)
        assert misses
        for wrong in misses:
            assert not T.score(ex, wrong + (EOS,) * (length - len(wrong))), wrong
        assert not T.score(ex, ex.answer)  # no EOS


def test_total_correlation_is_zero_or_log2_m():
    for name in C_ZERO:
        assert all(T.total_correlation(ex) == 0.0 and T.count_answers(ex) == 1
                   for ex in T.test_split(name, None, 5))
    split = T.test_split("lookup_any", None, 10)
    ms = [T.count_answers(ex) for ex in split]
    assert set(ms) == {2, 3, 4}
    for ex, m in zip(split, ms):
        assert math.isclose(T.total_correlation(ex), math.log2(m), abs_tol=1e-12)
        margs = T.marginals(ex)
        assert all(math.isclose(p, 1 / m) for pos in (0, 1) for p in margs[pos].values())


def test_generators_follow_the_stated_distributions():
    spans = T.test_split("span_copy_far", None, 25)
    assert all(ex.meta["start"] <= ex.size // 2 - SPAN for ex in spans)
    assert max(ex.meta["start"] / ex.size for ex in spans) > 0.4  # reaches the middle ...
    assert min(ex.meta["start"] / ex.size for ex in spans) < 0.1  # ... and the start
    counts = [int("".join(ex.answer)) for ex in T.test_split("count_long", None, 25)]
    assert min(counts) >= 1 and max(counts) <= MAX_COUNT and len(set(counts)) >= 12
    ex = T.test_split("lookup_long", 339, 1)[0]
    keys = [k for k, _ in ex.meta["rows"]]
    assert len(set(keys)) == 339 and ex.meta["query"] in keys


def test_the_oracle_solves_them_at_one_token_per_step():
    exs = [ex for name in LONG_PROMPT for ex in T.test_split(name, None, 1)]
    g = max(T.answer_length(ex.task, ex.size) for ex in exs)  # 5: 4 span items + EOS
    oracle = OracleLM()
    out = dllm.generate(oracle, oracle_prompts(exs), gen_length=g, steps=g)
    assert all(score_generation(exs, out)) and out.nfe == g
    # one step for everything: exact on the C = 0 tasks; lookup_any mixes digits of different values
    one = score_generation(exs, dllm.generate(oracle, oracle_prompts(exs), gen_length=g, steps=1))
    assert all(ok for ex, ok in zip(exs, one) if ex.task in C_ZERO)
    assert not all(ok for ex, ok in zip(exs, one) if ex.task == "lookup_any")


def test_narrow_keys_round_trip_and_refuse_too_many_rows():
    """``key_width`` (training curricula): the rows, prompt length and parser follow the width, and a
    table needing more distinct keys than the width allows is refused."""
    from dllm.tasks.kinds.long_prompt import LookupTask

    one = LookupTask(name="lookup_k1_test", description="", min_size=4, max_size=16, default_sizes=(8,),
                     size_meaning="rows", repeats=(1, 1), key_width=1)
    ex = one.generate(random.Random(3), 8)
    assert len(ex.prompt[:ex.prompt.index(",")]) == 3  # one key item, two digits
    assert len(ex.prompt) == one.args_length(8) == 4 * 8 - 1 + 2
    assert one.parse_args(ex.prompt) == dict(ex.meta) and one.is_valid(ex.meta, ex.answer)
    assert ex.answer == one.reference_answer(ex.meta) and len(ex.answer) == 2
    with pytest.raises(ValueError, match="the query key has 3 words, expected 1"):
        one.parse_args((*ex.prompt[:-1], "A", "B", "C"))
    with pytest.raises(ValueError, match="key_width 1 gives 16 distinct keys, too few for 17 rows"):
        LookupTask(name="x", description="", min_size=4, max_size=17, default_sizes=(8,), size_meaning="rows",
                   repeats=(1, 1), key_width=1)
    with pytest.raises(ValueError, match="key_width must be an integer >= 1, got 0"):
        LookupTask(name="x", description="", min_size=4, max_size=8, default_sizes=(8,), size_meaning="rows",
                   repeats=(1, 1), key_width=0)
    assert key_words(17, 2) == ("B", "B")
    with pytest.raises(ValueError, match="key index 256 does not fit 2 items"):
        key_words(256, 2)


def test_count_with_fewer_occurrences_and_its_bounds():
    """``max_count`` (training curricula): the query occurs 1..max_count times; out-of-range refused."""
    from dllm.tasks.kinds.long_prompt import CountTask

    few = CountTask(name="count_c4_test", description="", min_size=24, max_size=100, default_sizes=(24,),
                    size_meaning="n", max_count=4)
    rng = random.Random(0)
    counts = {int("".join(few.generate(rng, 40).answer)) for _ in range(200)}
    assert counts == {1, 2, 3, 4}
    with pytest.raises(ValueError, match="max_count 25 must be in 1..24"):
        CountTask(name="x", description="", min_size=24, max_size=100, default_sizes=(24,), size_meaning="n",
                  max_count=25)


def test_a_variant_with_a_task_word_prompts_as_that_task(monkeypatch):
    """``Task.word``: a training-only variant (own name, own size range) whose prompts carry a suite
    task's word, so a model trained on it meets the suite's prompts; sizes are checked against the
    variant's own range, scoring is the variant's."""
    from dllm.tasks.base import register
    from dllm.tasks.kinds.long_prompt import CountTask

    short = CountTask(name="count_short_test", description="", min_size=4, max_size=12, default_sizes=(8,),
                      size_meaning="n", max_count=4, word="count_long")
    monkeypatch.setattr(T.tasks, "_entries", dict(T.tasks._entries))  # registered for this test only
    register(short)
    ex = short.generate(random.Random(1), 6)
    assert ex.task == "count_short_test" and T.prompt_words(ex)[:2] == (T.BOS, "count_long")
    assert T.prompt_ids(ex)[1] == T.prompt_ids(T.test_split("count_long", 255, n=1)[0])[1]
    assert short.task_word == "count_long"
    plain = T.get_task("count_long")
    assert plain.task_word == plain.name == "count_long"
    with pytest.raises(ValueError, match="size 6 is out of range for task 'count_long'"):
        plain.check_size(6)
