"""``dllm.scoring.exact_match``: the one decode-and-score loop (evaluation, eval-tasks, compare)."""

import pytest

from dllm import tasks as T
from dllm.scoring.exact_match import c0_tasks, decode_and_score, evaluate
from dllm.models import load


@pytest.fixture(scope="module")
def oracle():
    return load("oracle")


def _examples():
    # copy and reverse of the same size share an answer length
    return [*T.test_split("copy", 4, n=2), *T.test_split("reverse", 4, n=2)]


def test_grouping_by_answer_length_or_by_task(oracle):
    exs = _examples()
    la = T.answer_length("copy", 4)
    assert la == T.answer_length("reverse", 4)
    mixed = decode_and_score(oracle, exs)
    split = decode_and_score(oracle, exs, by_task=True)
    for tally in (mixed, split):
        assert tally.counts == {"copy": 2, "reverse": 2} and tally.accuracy == {"copy": 1.0, "reverse": 1.0}
        assert tally.row_forwards == 4 * la and tally.generated_tokens == 4 * la
    assert (mixed.forwards, split.forwards) == (la, 2 * la)  # one batch vs one batch per task


def test_tokens_per_step_sets_the_steps_of_each_block(oracle):
    exs = _examples()
    la = T.answer_length("copy", 4)
    tally = decode_and_score(oracle, exs, tokens_per_step=2, block_length=2)
    assert tally.forwards == -(-la // 2)  # blocks of 2, one step each
    result = evaluate(oracle, exs, tokens_per_step=2)
    assert result.forwards == -(-la // 2) and set(result.c0) == {"copy", "reverse"} <= set(c0_tasks())


def test_tokens_per_step_checks(oracle):
    exs = T.test_split("copy", 4, n=1)
    with pytest.raises(ValueError, match=r"k must be an integer >= 1 \(tokens per step\), got 0"):
        decode_and_score(oracle, exs, "low_confidence", tokens_per_step=0)
    with pytest.raises(ValueError, match="k applies to fixed-step samplers only"):
        decode_and_score(oracle, exs, "threshold", tokens_per_step=2)
    with pytest.raises(KeyError, match="Unknown sampler 'nope'"):
        decode_and_score(oracle, exs, "nope")


def test_long_prompts_are_batched_by_length():
    from dllm.scoring.exact_match import BUCKET_RATIO, length_batches

    def lengths(batches):
        return [[len(T.prompt_ids(ex)) for ex in b] for b in batches]

    short = [*T.test_split("copy", 4, n=3), *T.test_split("copy", 8, n=3)]  # short prompts: order kept
    assert length_batches(short, 64) == [short]
    assert length_batches(short, 4) == [short[:4], short[4:]]
    task = T.get_task("count_long")
    long = [ex for size in task.default_sizes for ex in T.test_split("count_long", size, n=2)][::-1]
    batches = length_batches(long, 64)
    assert sorted(map(id, (ex for b in batches for ex in b))) == sorted(map(id, long))  # each once
    got = lengths(batches)
    assert len(got) == len(task.default_sizes) and all(max(b) <= BUCKET_RATIO * min(b) for b in got)
    assert [b[0] for b in got] == sorted(b[0] for b in got)  # shortest first
    assert all(len(b) <= 3 for b in length_batches(long, 3))
    assert length_batches(long, 64, by_length=False) == [long]


def test_length_batches_decode_like_one_batch(oracle):
    """Batching by length changes the batches, not an example's answer (the oracle is exact)."""
    exs = [*T.test_split("count_long", 24, n=2), *T.test_split("count_long", 63, n=2),
           *T.test_split("count_long", 251, n=2)]
    tally = decode_and_score(oracle, exs, by_task=True)
    assert tally.counts == {"count_long": 6} and tally.accuracy == {"count_long": 1.0}
    with pytest.raises(ValueError, match="max_batch"):
        decode_and_score(oracle, exs, max_batch=0)


def test_a_setting_and_its_keyword_form_decode_alike(oracle):
    from dllm.settings import DecodeSettings

    exs = [*T.test_split("shuffle", 4, n=3), *T.test_split("copy", 4, n=2)]
    setting = DecodeSettings.parse("low_confidence:k=2", block_length=2)
    a = decode_and_score(oracle, exs, setting)
    b = decode_and_score(oracle, exs, "low_confidence", tokens_per_step=2, block_length=2)
    assert (a.solved, a.forwards, a.forwarded_tokens) == (b.solved, b.forwards, b.forwarded_tokens)
    la = T.answer_length("copy", 4)  # = shuffle's at size 4: one batch
    assert la == 5 and a.forwards == 3  # blocks of 2, 2 and 1 positions, one step (k = 2) each
    with pytest.raises(ValueError, match="give DecodeSettings alone"):
        decode_and_score(oracle, exs, setting, tokens_per_step=2)


def test_record_keeps_each_examples_own_outcome(oracle):
    exs = [*T.test_split("shuffle", 4, n=3), *T.test_split("copy", 4, n=2)]
    tally = decode_and_score(oracle, exs, "low_confidence", tokens_per_step=2, record=True)
    la = T.answer_length("copy", 4)
    assert sorted(tally.outcomes) == list(range(len(exs)))
    assert [tally.outcomes[i].correct for i in range(len(exs))] == [tally.solved[i] for i in range(len(exs))]
    for o in tally.outcomes.values():
        assert o.forwards == -(-la // 2)  # every step changed every row: ceil(la / k) forwards each
        assert len(o.trace) == la and max(o.trace) == o.forwards - 1  # the step that committed each position
        assert 0 <= o.content <= la
    assert decode_and_score(oracle, exs).outcomes == {}  # kept only when asked


def test_plan_steps_counts_the_prompts_partial_block():
    from dllm.schedule import plan_block_causal, plan_blocks
    from dllm.settings import plan_steps

    def grid(gen_length, prompt_length, k):  # a block-causal model's grid of blocks of 4
        plan = plan_block_causal(gen_length, None, None, fixed_steps=False, block_size=4,
                                 prompt_lengths=[prompt_length])
        return plan_steps(plan, k)

    assert grid(9, 8, None) is None
    assert grid(9, 8, 1) == 3 * 4  # blocks [0,4) [4,8) [8,9): prompt ends on the grid
    assert grid(9, 7, 1) == 3 * 4  # the prompt's block has one free position: 1 + 4 + 4
    assert grid(9, 7, 2) == 3 * 2
    assert grid(10, 7, 1) == 4 * 4  # 1 + 4 + 4 + 1
    assert grid(2, 5, 1) == 1 * 4  # the whole answer fits the prompt's partial block
    assert plan_steps(plan_blocks(10, 4, None, fixed_steps=False), 2) == 3 * 2  # = steps_for(10, 4, 2)


@pytest.mark.parametrize("k", [None, 1, 2])
def test_a_block_causal_model_decodes_on_its_grid_like_each_prompt_alone(k):
    """tiny-random-sdar (block 4): prompts of every length mod 4 in one call are grouped by that offset
    (a batch shares its blocks) and each decodes as it does alone on the model's grid."""
    from dllm.engine import generate
    from dllm.settings import plan_for, plan_steps

    model = load("tiny-random-sdar")
    examples = [ex for n in ("copy", "reverse", "sort") for size in T.get_task(n).default_sizes
                for ex in T.test_split(n, size, n=2)]
    assert len({len(T.prompt_ids(ex)) % 4 for ex in examples}) > 1
    together = decode_and_score(model, examples, "low_confidence", tokens_per_step=k, record=True)
    for i, ex in enumerate(examples):
        alone = decode_and_score(model, [ex], "low_confidence", tokens_per_step=k, record=True).outcomes[0]
        got = together.outcomes[i]
        assert (got.correct, got.content, got.trace) == (alone.correct, alone.content, alone.trace)
        prompt, la = T.prompt_ids(ex), T.answer_length(ex.task, ex.size)
        out = generate(model, [prompt], "low_confidence", gen_length=la, return_trace=True,
                       steps=plan_steps(plan_for(model, [prompt], la, None, None, fixed_steps=False), k))
        assert out.nfe == alone.forwards
    assert sum(together.counts.values()) == len(examples)
