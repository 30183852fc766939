"""OracleLM as a model: logits = exact log-marginals, batching, noise, errors, engine plumbing."""

import math
import random
import time

import numpy as np
import pytest
import torch

import dllm
from dllm.inputs import model_device as _model_device
from dllm import tasks as T
from dllm.models.oracle import NEG_LOGIT, OracleLM, oracle_prompts, score_generation

MASK, EOS = T.word_id(T.MASK), T.word_id(T.EOS)
V = len(T.vocabulary())


@pytest.fixture(scope="module")
def model():
    return OracleLM()


def _row(ex, committed=None, extra=0):
    """Prompt ids + the answer region (masks, with ``committed`` {pos: word} filled in)."""
    region = [MASK] * (T.answer_length(ex.task, ex.size) + extra)
    for pos, word in (committed or {}).items():
        region[pos] = T.word_id(word)
    return oracle_prompts([ex])[0] + region


def _check_against_marginals(logits, ex, committed, start):
    """softmax(logits) at the answer positions equals tasks.marginals; committed are one-hot."""
    probs = torch.softmax(logits.double(), dim=-1)
    for pos, dist in enumerate(T.marginals(ex, committed)):
        want = torch.zeros(V, dtype=torch.float64)
        for word, p in dist.items():
            want[T.word_id(word)] = p
        assert torch.allclose(probs[start + pos], want, atol=1e-6), (ex.task, pos)


@pytest.mark.parametrize("task,size", [("shuffle", 5), ("replace_random", 6), ("insert_random_2tok", 4),
                                       ("chain_must", 4), ("latin4", 4), ("pick_pair", 4), ("sudoku4", 8)])
def test_logits_are_log_marginals_given_committed_words(model, task, size):
    rng = random.Random(3)
    ex = T.test_split(task, size, 1)[0]
    answer = T.target_words(ex)
    for n_commit in (0, 1, 3):
        committed = {p: answer[p] for p in rng.sample(range(len(answer) - 1), min(n_commit, len(answer) - 1))}
        ids = torch.tensor([_row(ex, committed)])
        logits = model(ids).logits[0]  # [T, V]
        start = len(T.prompt_words(ex))
        _check_against_marginals(logits, ex, committed, start)
        # every non-mask token (prompt and committed) is a one-hot on itself
        real = ids[0] != MASK
        assert (logits[real].argmax(-1) == ids[0][real]).all()
        assert (logits[real].max(-1).values == 0).all() and (logits[real] <= 0).all()
        assert logits.min() == NEG_LOGIT and model.last_invalid.tolist() == [False]


def test_inconsistent_commits_give_uniform_words_or_raise(model):
    ex = T.test_split("copy", 4, 1)[0]
    wrong = next(w for w in "ABCDEFGHIJKLMNOP" if w != ex.answer[0])
    ids = torch.tensor([_row(ex, {0: wrong}), _row(ex)])
    logits = model(ids).logits
    assert model.last_invalid.tolist() == [True, False]
    start = len(T.prompt_words(ex))
    specials = [T.word_id(w) for w in T.SPECIALS]
    words = [i for i in range(V) if i not in specials]
    masked = logits[0, start + 1:]  # [L-1, V]
    assert (masked[:, words] == 0).all() and (masked[:, specials] == NEG_LOGIT).all()
    assert logits[0, start].argmax() == T.word_id(wrong)  # the committed word stays one-hot
    with pytest.raises(ValueError, match="no valid 'copy' answer agrees"):
        OracleLM(invalid="raise")(ids)


def test_region_longer_or_shorter_than_the_answer(model):
    ex = T.test_split("reverse", 4, 1)[0]
    start, length = len(T.prompt_words(ex)), T.answer_length("reverse", 4)
    logits = model(torch.tensor([_row(ex, extra=3)])).logits[0]
    assert (logits[start + length:].argmax(-1) == EOS).all()  # past L_ans: EOS padding
    _check_against_marginals(logits[: start + length], ex, {}, start)
    bad = _row(ex, extra=3)
    bad[-1] = T.word_id("A")  # a committed word after the answer cannot be EOS padding
    model(torch.tensor([bad]))
    assert model.last_invalid.tolist() == [True]
    short = oracle_prompts([ex])[0] + [MASK] * 2  # a truncated region: the first two positions only
    logits = model(torch.tensor([short])).logits[0]
    assert logits.shape[0] == start + 2
    assert logits[start:].argmax(-1).tolist() == [T.word_id(w) for w in ex.answer[:2]]


def test_ragged_mixed_task_batch_equals_each_row_alone(model):
    exs = [T.test_split(t, s, 1)[0] for t, s in (("copy", 3), ("shuffle_2tok", 4), ("chain", 2), ("sudoku4", 12))]
    rows = [_row(ex) for ex in exs]
    width = max(len(r) for r in rows)
    padded = torch.tensor([[T.word_id(T.PAD)] * (width - len(r)) + r for r in rows])
    kpm = padded != T.word_id(T.PAD)
    batch = model(padded, key_padding_mask=kpm, positions=(kpm.long().cumsum(1) - 1).clamp_min(0)).logits
    for j, r in enumerate(rows):
        alone = model(torch.tensor([r])).logits[0]
        assert torch.equal(batch[j, width - len(r):], alone)


def test_noise_is_seeded_and_only_perturbs(model):
    ex = T.test_split("replace_random", 5, 1)[0]
    ids = torch.tensor([_row(ex)] * 3)
    exact = model(ids).logits
    a, b = OracleLM(noise_std=0.1, seed=7), OracleLM(noise_std=0.1, seed=7)
    na, nb = a(ids).logits, b(ids).logits
    assert torch.equal(na, nb)  # same seed, same noise
    assert not torch.equal(na[0], na[1])  # i.i.d. across rows (and positions)
    assert not torch.equal(a(ids).logits, na)  # the stream advances
    a.reseed(7)
    assert torch.equal(a(ids).logits, na)
    diff = (na - exact).flatten()
    assert abs(diff.std().item() - 0.1) < 0.01 and abs(diff.mean().item()) < 0.01


def test_no_weights_device_and_generate(model):
    assert list(model.parameters()) == [] and _model_device(model) == torch.device("cpu")
    assert model.family == "oracle" and model.config.vocab_size == V
    assert (model.mask_id, model.eos_id, model.pad_id, model.bos_id) == (1, 4, 0, 2)
    exs = T.test_split("insert_random", 3, 2) + T.test_split("sort_num", 8, 2)  # ragged prompts
    out = dllm.generate(model, oracle_prompts(exs), gen_length=17, block_length=17, steps=17)
    assert all(score_generation(exs, out))
    assert out.texts[0] == " ".join(T.cut_answer(T.vocabulary()[t] for t in out.generated[0].tolist()))


@pytest.mark.parametrize("edit,match", [
    (lambda r: r[:-1], r"has no \[SEP\]"),  # a prompt without [SEP] (the answer follows directly)
    (lambda r: r[:1] + [T.word_id("A")] + r[2:], "cannot read the prompt"),  # unknown task token
    (lambda r: r[1:], r"expected \[BOS\]"),
])
def test_bad_prompts_are_clear_errors(model, edit, match):
    ex = T.test_split("copy", 4, 1)[0]
    prompt = edit(oracle_prompts([ex])[0])
    with pytest.raises(ValueError, match=match):
        model(torch.tensor([prompt + [MASK] * 5]))
    with pytest.raises(ValueError, match=match):
        dllm.generate(model, [prompt], gen_length=5)


def test_free_text_prompt_names_the_unknown_words_not_cfg(model):
    with pytest.raises(ValueError, match=r"does not know: 'what', 'is', 'two', 'plus'") as info:
        dllm.generate(model, "what is two plus two", gen_length=5)
    assert "cfg" not in str(info.value).lower()
    with pytest.raises(ValueError, match=r"only \[PAD\] tokens \(words the task vocabulary does not know\?\)"):
        model(torch.tensor([[0, 0, 0, MASK, MASK]]))  # what such a prompt encoded to: [PAD]s, no CFG


def test_unsupported_requests(model):
    ex = T.test_split("copy", 4, 1)[0]
    ids = torch.tensor([_row(ex)])
    with pytest.raises(ValueError, match="no attention maps"):
        model(ids, want_attn_layers=(0,))
    with pytest.raises(ValueError, match="cfg_scale=0"):
        dllm.generate(model, oracle_prompts([ex]), gen_length=5, cfg_scale=1.0)
    for kwargs in ({"noise_std": -1.0}, {"invalid": "zero"}, {"seed": 1.5}):
        with pytest.raises(ValueError):
            OracleLM(**kwargs)


def test_forward_batch16_takes_milliseconds(model):
    exs = T.test_split("shuffle", 8, 16)
    rng = random.Random(0)
    rows = [_row(ex, {p: ex.answer[p] for p in rng.sample(range(8), 2)}) for ex in exs]
    ids = torch.tensor(rows)
    model(ids)  # builds the 16 answer tables (8! rows each) once
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        model(ids)
        times.append(time.perf_counter() - t0)
    assert np.median(times) < 0.25, times  # measured ~8 ms on a loaded 2-core machine
    assert math.isfinite(model(ids).logits.sum().item())
