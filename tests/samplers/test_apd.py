"""APD (``dllm.samplers.apd``) against the transcription of the authors' loop
(``tests/reference/decoders/apd_generate.py``): the same tokens and diffusion forwards on 20 prompts x 3
settings, the embedded tiny-dream as the diffusion model and tiny-ar as the verifier."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm import tasks as T
from builders import MASK, V, decode_state, log_probs, prob_row, step_input
from dllm.samplers.apd import accepted_prefix, mixture_argmax
from tests.reference.decoders.apd_generate import apd_generate

SETTINGS = [dict(mixture=0.7), dict(mixture=0.9), dict(mixture=0.5, temperature=1.0)]


@pytest.fixture(scope="module")
def models():
    dream = dllm.load("tiny-dream")
    ar, _ = dllm.load_target("tiny-ar")
    return dream, ar.eval()


def prompts(model, n: int = 20) -> list[tuple[list[int], int]]:
    """(prompt ids, answer length) of ``n`` test-split instances across the suite."""
    out = []
    for name in T.suite_task_names():
        for ex in T.test_split(name, n=1):
            out.append((model.generation_prompt(" ".join(T.prompt_words(ex))), T.answer_length(name, ex.size)))
    return out[:: max(1, len(out) // n)][:n]


def upto_eos(ids: list[int], eos: int) -> list[int]:
    return ids[:ids.index(eos) + 1] if eos in ids else ids


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_equals_the_authors_loop(models, setting):
    dream, ar = models
    t = setting.get("temperature", 0.0)
    opts = {k: v for k, v in setting.items() if k != "temperature"}
    eos = dream.eos_ids[0]
    for i, (prompt, g) in enumerate(prompts(dream)):
        ref, ref_nfe = apd_generate(dream, ar, prompt, g, mask_id=dream.mask_id, eos_id=eos, temperature=t,
                                    generator=torch.Generator().manual_seed(i), **opts)
        out = dllm.generate(dream, [prompt], sampler="apd", verifier=ar, gen_length=g, temperature=t, seed=i, **opts)
        ours = out.sequences[0, out.prompt_length:].tolist()
        assert upto_eos(ours, eos) == upto_eos(ref, eos), (i, prompt)
        assert out.nfe == ref_nfe, (i, prompt)


def test_batched_and_ragged_rows_equal_each_row_alone(models):
    dream, ar = models
    rows = [p for p, _ in prompts(dream, 6)]
    alone = [dllm.generate(dream, [p], sampler="apd", verifier=ar, gen_length=8).sequences[0, -8:].tolist() for p in rows]
    batch = dllm.generate(dream, rows, sampler="apd", verifier=ar, gen_length=8).sequences[:, -8:].tolist()
    assert batch == alone


def test_accepts_a_prefix_and_always_the_first_draft():
    active = torch.tensor([[False, True, True, True, True]])
    match = torch.tensor([[False, False, True, False, True]])
    assert accepted_prefix(match, active).tolist() == [[False, True, True, False, False]]
    d = torch.tensor([[[3.0, 0.0]]])
    a = torch.tensor([[[0.0, 5.0, 9.0]]])  # the verifier's extra id is outside the shared vocabulary
    assert mixture_argmax(d, a, 0.9).tolist() == [[0]] and mixture_argmax(d, a, 0.1).tolist() == [[1]]


class _Agrees:
    """A verifier stub: its logits are uniform, so at mixture 1 the target is the diffusion arg-max."""

    def __call__(self, ids, attention_mask=None, position_ids=None):
        from types import SimpleNamespace

        return SimpleNamespace(logits=torch.zeros(*ids.shape, V))


def test_a_row_that_accepts_any_of_its_eos_ids_ends_its_block():
    """A model with two EOS ids (eos and end-of-turn, as Dream/Qwen chat models): a row whose accepted
    drafts hold either id is done, and the rest of its block becomes the first EOS id, as the engine's
    stop rule (``answer_ended``) reads every id of ``eos_ids``. Row 0 accepts the eos, row 1 the
    end-of-turn id, row 2 neither (it keeps its masks for later steps)."""
    from dllm.samplers import make_sampler

    eos, eot, prompt = 4, 7, 2
    drafts = [[5, eos, 6, 3, 2], [5, eot, 6, 3, 2], [5, 6, 3, 2, 8]]  # each position's arg-max
    logits = log_probs([[prob_row(0.9, 1)] * prompt + [prob_row(0.9, t) for t in row] for row in drafts])
    state = decode_state((3, prompt + 5), prompt_length=prompt, mask_id=MASK)
    state.x[:, :prompt] = 1
    state.extras["eos_ids"] = (eos, eot)
    inp = step_input(logits, tokens=state.x.clone(), window=(prompt, prompt + 5))
    apd = make_sampler("apd", verifier=_Agrees(), mixture=1.0, lookahead=2)  # two drafts a step, both accepted
    out = apd.step(inp, state)
    commit, tokens = out.commit[:, prompt:].tolist(), out.tokens[:, prompt:].tolist()
    assert commit[0] == commit[1] == [True] * 5 and commit[2] == [True, True, False, False, False]
    assert tokens[0] == [5, eos, eos, eos, eos] and tokens[1] == [5, eot, eos, eos, eos]
    assert tokens[2][:2] == [5, 6]


def test_lookahead_caps_the_tokens_of_a_step(models):
    """``lookahead`` M: at most M drafts per step (the reference also truncates the diffusion input at
    the decoding position + M; here the forward reads the query the cache policy gives)."""
    dream, ar = models
    prompt, g = max(prompts(dream), key=lambda pg: pg[1])
    trace = dllm.generate(dream, [prompt], sampler="apd", verifier=ar, mixture=1.0, lookahead=2, gen_length=g,
                          return_trace=True).trace[0].tolist()
    assert max(trace.count(s) for s in set(trace)) <= 2 and len(set(trace)) >= g // 2


def test_mixture_one_is_the_diffusion_arg_max_every_token_per_step(models):
    """w = 1 trusts the diffusion model alone: every draft matches, one forward per block."""
    dream, ar = models
    prompt, g = prompts(dream, 1)[0]
    out = dllm.generate(dream, [prompt], sampler="apd", verifier=ar, mixture=1.0, gen_length=g)
    assert out.nfe == 1


@pytest.mark.parametrize("bad, match", [(dict(mixture=1.5), "mixture"), (dict(lookahead=0), "lookahead"),
                                        (dict(verifier=""), "verifier")])
def test_bad_options(bad, match):
    with pytest.raises(ValueError, match=match):
        dllm.generate(dllm.load("tiny-dream"), "[BOS] sort D A C B [SEP]", sampler="apd", **bad)


def test_the_shipped_verifier_is_trained_on_the_tiny_models_tasks():
    """tiny-ar-mini (``dllm train --recipe tiny-ar-mini``), APD's default verifier, answers PB-mini
    prompts greedily, which only a trained model does; its training.json names the recipe."""
    import json

    from dllm.models.loading import EMBEDDED_DIR
    from dllm.train.ar import greedy_answers

    ar, _ = dllm.load_target("tiny-ar-mini")
    solved = 0
    for name in ("copy", "reverse", "sort"):
        exs = T.test_split(name, 4, n=4)
        answers = greedy_answers(ar, [T.prompt_ids(ex) for ex in exs], T.answer_length(name, 4))
        words = T.vocabulary()
        solved += sum(T.score(ex, [words[t] for t in a]) for ex, a in zip(exs, answers))
    assert solved >= 10
    assert json.loads((EMBEDDED_DIR / "tiny-ar-mini" / "training.json").read_text())["recipe"]["name"] == "tiny-ar-mini"


def test_the_verifier_loads_before_any_clock():
    """``Sampler.prepare``: APD loads its verifier there (once a process), and ``generate`` leaves that
    time out of its wall time, as an evaluation leaves it out of its clock."""
    import time

    from dllm.samplers import apd
    from dllm.samplers.threshold import Threshold

    apd._LOADED.pop("tiny-ar-mini@cpu", None)
    dllm.samplers.make_sampler("apd").prepare(torch.device("cpu"))
    assert "tiny-ar-mini@cpu" in apd._LOADED

    class Slow(Threshold):
        seen: list = []

        def prepare(self, device):
            self.seen.append(device)
            time.sleep(0.5)

    out = dllm.generate(dllm.load("tiny-random-llada"), [[5, 6, 7]], sampler=Slow(), gen_length=4)
    assert Slow.seen == [torch.device("cpu")] and out.wall_time < 0.4
