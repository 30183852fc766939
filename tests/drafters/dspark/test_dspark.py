"""The ``dspark`` drafter: greedy output = transformers' ``generate`` for every Markov head type and
verify-length policy (batch 1 and ragged batches), checkpoints round-trip in the authors' format, the
block convention (slot k drafts position anchor + k + 1), the Markov head really conditions on the
previous drafted token, and bad options / checkpoints get clear errors."""

import json

import pytest
import torch

from dllm.drafters.base import make_drafter
from dllm.drafters.dspark.io import config_from_hf, load_dspark, random_dspark, save_dspark
from dllm.drafters.dspark.model import DSparkHeads, pick_tokens
from dllm.drafters.loop import speculative_generate
from dllm.drafters.verify import SamplingParams
from tests.drafters.speculative_helpers import hf_greedy, tiny_target

NEW = 24
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19]]
HEADS = {
    "vanilla": DSparkHeads(markov_rank=8, markov_head_type="vanilla", enable_confidence_head=True,
                           confidence_head_with_markov=True),
    "gated": DSparkHeads(markov_rank=8, markov_head_type="gated", enable_confidence_head=True),
    "rnn": DSparkHeads(markov_rank=8, markov_head_type="rnn", enable_confidence_head=True,
                       confidence_head_with_markov=True),
    "parallel": DSparkHeads(),  # no Markov head, no confidence head: token probabilities as confidences
}


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=2, vocab=64, hidden=64, layers=4, eos=3)


@pytest.fixture(scope="module")
def truth(target):
    return [hf_greedy(target, p, NEW, eos=3) for p in PROMPTS]


def spiky(model, seed=0):
    """Make the heads matter: a strong Markov transition and spread-out confidences."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if model.markov_head is not None:
            for p in model.markov_head.parameters():
                p.normal_(0.0, 1.0, generator=g)
        if model.confidence_head is not None:
            model.confidence_head.proj.weight.normal_(0.0, 1.0, generator=g)
    return model


def make(target, kind, block=5, seed=0):
    return spiky(random_dspark(target, 1, block, 63, heads=HEADS[kind], seed=seed, target_layer_ids=(1, 3)), seed)


@pytest.mark.parametrize("kind", list(HEADS))
@pytest.mark.parametrize("policy", ["threshold:threshold=0.0", "threshold:threshold=0.5", "survival:threshold=0.3"])
def test_greedy_equals_transformers(target, truth, kind, policy):
    drafter = make_drafter("dspark", model=make(target, kind), verify_length=policy)
    assert speculative_generate(target, drafter, PROMPTS, max_new_tokens=NEW).generated == truth
    for fast in (True, False):
        out = speculative_generate(target, drafter, PROMPTS[:1], max_new_tokens=NEW, fast_path=fast)
        assert out.generated == truth[:1]
    smaller = speculative_generate(target, drafter, PROMPTS, max_new_tokens=NEW, plan=3)
    assert smaller.generated == truth


def test_the_markov_head_conditions_on_the_previous_token(target):
    """Same base logits, two anchors: the Markov head changes the first picks; without it they match."""
    model = make(target, "vanilla")
    base = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0)).expand(2, -1, -1)
    hidden = torch.randn(1, 4, 64).expand(2, -1, -1)
    tokens, logits, _ = pick_tokens(model, base, hidden, torch.tensor([7, 9]), SamplingParams(0.0), None)
    bias = model.markov_head.markov_w2(model.markov_head.markov_w1(torch.tensor([7, 9])))
    assert torch.allclose(logits[:, 0], base[:, 0] + bias)
    assert torch.equal(tokens[:, 0], (base[:, 0] + bias).argmax(-1))
    # position k reads the token picked at k - 1
    nxt = model.markov_head.markov_w2(model.markov_head.markov_w1(tokens[:, 0]))
    assert torch.allclose(logits[:, 1], base[:, 1] + nxt)
    plain = make(target, "parallel")
    t2, l2, _ = pick_tokens(plain, base, hidden, torch.tensor([7, 9]), SamplingParams(0.0), None)
    assert torch.equal(l2, base) and torch.equal(t2[0], t2[1])


def test_checkpoint_round_trip_in_the_authors_format(target, tmp_path):
    model = make(target, "gated", block=6)
    save_dspark(model, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["Qwen3DSparkModel"] and hf["block_size"] == 6 and hf["markov_rank"] == 8
    assert hf["markov_head_type"] == "gated" and hf["enable_confidence_head"] is True
    assert hf["confidence_head_with_markov"] is False and hf["target_layer_ids"] == [1, 3]
    again = load_dspark(tmp_path)
    for k, v in model.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    assert {"embed_tokens.weight", "lm_head.weight", "markov_head.gate_proj.weight",
            "confidence_head.proj.bias"} <= set(again.state_dict())
    drafter = make_drafter("dspark", model=str(tmp_path))
    assert drafter.block_size == 7  # K = 6 drafts + the anchor


def test_bad_configs_name_what_is_wrong(target, tmp_path):
    save_dspark(make(target, "vanilla"), tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ValueError, match="markov_rank"):
        config_from_hf({k: v for k, v in hf.items() if k != "markov_rank"})
    with pytest.raises(ValueError, match="embedding output"):
        config_from_hf({**hf, "target_layer_ids": [-1, 2]})
    with pytest.raises(ValueError, match="Qwen3DSparkModel"):
        config_from_hf({**hf, "architectures": ["DFlashDraftModel"]})
    with pytest.raises(ValueError, match="markov_head_type"):
        config_from_hf({**hf, "markov_head_type": "lstm"})


@pytest.mark.parametrize("options, words", [
    ({"verify_length": "sometimes"}, ["sometimes", "full", "survival", "threshold"]),
    ({"verify_length": "threshold:threshold=-1"}, ["threshold", "-1"]),
    ({"sampel": True}, ["sampel", "Valid options", "verify_length"]),
    ({"dtype": "float8"}, ["float8"]),
    ({"model": None}, ["needs a DSpark checkpoint"]),
])
def test_bad_options(options, words):
    with pytest.raises((ValueError, TypeError, KeyError)) as err:
        make_drafter("dspark", **options)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_call_errors(target):
    drafter = make_drafter("dspark", model=make(target, "vanilla"))
    with pytest.raises(ValueError, match="exceeds the dspark drafter's trained block size 6"):
        speculative_generate(target, drafter, PROMPTS[:1], max_new_tokens=4, plan=8)
    other = tiny_target(seed=2, vocab=64, hidden=32, layers=4, eos=3)
    with pytest.raises(ValueError, match="hidden size"):
        speculative_generate(other, drafter, PROMPTS[:1], max_new_tokens=4)
    with pytest.raises(TypeError, match="DSparkModel"):
        make_drafter("dspark", model=torch.nn.Linear(2, 2))
