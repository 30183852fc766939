"""Bad input fails before anything runs, with an error naming the bad value and what is valid."""

import pytest
import torch

from dllm.drafters.base import Draft, Drafter, list_drafters, make_drafter
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.models import tiny
from tests.drafters.speculative_helpers import OracleDrafter, tiny_target

P = [[5, 6, 7]]


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=1)


@pytest.fixture(scope="module")
def llada():
    return tiny("llada", seed=3)


def test_drafter_vocabulary_must_match_the_target(llada):
    small = tiny_target(vocab=96)
    with pytest.raises(ValueError, match="vocabulary of 112 tokens but the target's logits have 96"):
        speculative_generate(small, make_drafter("dlm", model=llada), P, max_new_tokens=4)


def test_drafter_tokenizer_must_match_the_target(target, llada):
    dream = tiny("dream")  # same vocabulary size (112), a different tokenizer
    assert dream.vocab_size == target.config.vocab_size
    with pytest.raises(ValueError, match="tokenizer differs from the target's"):
        speculative_generate(target, make_drafter("dlm", model=dream), P, max_new_tokens=4,
                             tokenizer=llada.tokenizer)


@pytest.mark.parametrize("block", [0, -2, 1.5, True])
def test_block_size_below_one(target, block):
    with pytest.raises(ValueError, match=r"plan must be a Plan, 'auto', a BlockHead or a positive int block size"):
        speculative_generate(target, "ngram", P, max_new_tokens=4, plan=block)
    with pytest.raises(ValueError, match=r"Plan block_size must be a positive int"):
        Plan(block_size=block)


def test_target_with_a_cache_that_cannot_be_cropped():
    from transformers import MambaConfig, MambaForCausalLM

    mamba = MambaForCausalLM(MambaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, state_size=4)).eval()
    with pytest.raises(ValueError, match=r"cache layers \['LinearAttentionLayer'\] that cannot be cropped"):
        speculative_generate(mamba, "ngram", P, max_new_tokens=4)


def test_target_without_a_cache_argument():
    class NoCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("C", (), {"vocab_size": 8})()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, input_ids):
            return input_ids

    with pytest.raises(ValueError, match="takes no KV cache"):
        speculative_generate(NoCache(), "ngram", P, max_new_tokens=4)


def test_sliding_window_target_refuses_a_batch():
    sw = tiny_target(seed=2, use_sliding_window=True, sliding_window=5, max_window_layers=0)
    with pytest.raises(ValueError, match="sliding-window layers.*one prompt at a time \\(got 2\\)"):
        speculative_generate(sw, "ngram", P * 2, max_new_tokens=4)


def test_a_diffusion_model_is_not_a_target(llada):
    with pytest.raises(TypeError, match="must be an autoregressive transformers model"):
        speculative_generate(llada, "ngram", P, max_new_tokens=4)
    with pytest.raises(TypeError, match="must be a transformers causal LM"):
        speculative_generate(object(), "ngram", P, max_new_tokens=4)


def test_tapped_layers_must_exist(target):
    with pytest.raises(ValueError, match=r"taps target layers \[0, 5\], but \[5\] are not decoder layers "
                                         r"of a 2-layer target \(valid: 0 .. 1\)"):
        speculative_generate(target, OracleDrafter(target, taps=(0, 5)), P, max_new_tokens=4)


@pytest.mark.parametrize("kw,match", [
    (dict(temperature=-0.5), "temperature must be"),
    (dict(temperature=1.0, top_p=0.0), "top_p must be"),
    (dict(temperature=1.0, top_k=-3), "top_k must be"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    (dict(seed=-1), "seed must be"),
    (dict(stop="x"), "stop strings .* need a tokenizer"),
    (dict(stop=[""]), "stop must be a non-empty string"),
])
def test_bad_options(target, kw, match):
    kw = {"max_new_tokens": 4, **kw}
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, "ngram", P, **kw)


@pytest.mark.parametrize("prompts,match", [
    ("hello", "string prompts need a tokenizer"),
    ([[5, 500]], r"outside the target's vocabulary \[0, 112\): \[500\]"),
    ([[]], "prompt 0 is empty"),
    ([[5, 1.5]], "token ids must be integers"),
    ([], "prompts must be a non-empty"),
])
def test_bad_prompts(target, prompts, match):
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, "ngram", prompts, max_new_tokens=4)


def test_unknown_drafter_lists_the_valid_ones(target):
    with pytest.raises(KeyError, match="Unknown drafter 'nope'. Valid drafters: .*dlm.*ngram"):
        speculative_generate(target, "nope", P, max_new_tokens=4)
    with pytest.raises(TypeError, match="Unknown option.*'n'.*Valid options: max_ngram, min_ngram"):
        make_drafter("ngram:n=3")
    names = [n for n, _ in list_drafters()]
    assert {"ngram", "dlm"} <= set(names)


def test_bad_drafter_options(llada):
    with pytest.raises(ValueError, match=r"min_ngram must be an integer in \[1, 2\]"):
        make_drafter("ngram", max_ngram=2, min_ngram=3)
    with pytest.raises(KeyError, match="Unknown sampler 'nosuch'"):
        make_drafter("dlm", model=llada, sampler="nosuch")
    with pytest.raises(ValueError, match="the dlm drafter needs a diffusion model"):
        make_drafter("dlm")
    with pytest.raises(TypeError, match="must be a dllm DiffusionLM"):
        make_drafter("dlm", model=torch.nn.Linear(2, 2))


def test_dlm_steps_beyond_the_block(target, llada):
    with pytest.raises(ValueError, match=r"dlm steps=4 exceeds the 3 tokens drafted per round \(block_size 4\)"):
        speculative_generate(target, make_drafter("dlm", model=llada, steps=4), P, max_new_tokens=4, plan=4)


def test_a_drafter_returning_the_wrong_shape(target):
    class Broken(Drafter):
        def propose(self, ctx):
            return Draft(tokens=torch.zeros((ctx.batch_size, ctx.num_draft + 1), dtype=torch.long))

    with pytest.raises(ValueError, match=r"returned tokens torch.int64 \[1, 4\]; expected long \[1, 3\]"):
        speculative_generate(target, Broken(), P, max_new_tokens=4, plan=4)


def test_a_target_that_returns_no_hidden_states(target):
    class NoHidden(torch.nn.Module):
        """Wraps the target and drops ``output_hidden_states``."""

        def __init__(self, inner):
            super().__init__()
            self.inner, self.config, self.generation_config = inner, inner.config, inner.generation_config

        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None, **kw):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              cache=cache, use_cache=use_cache)

    with pytest.raises(ValueError, match=r"taps target layers \[1\], but target NoHidden returned none hidden "
                                         r"states with output_hidden_states=True \(expected 3\)"):
        speculative_generate(NoHidden(target), OracleDrafter(target, taps=(1,)), P, max_new_tokens=4)
    ok = speculative_generate(NoHidden(target), "ngram", P, max_new_tokens=4)  # nothing tapped: fine
    assert len(ok.generated[0]) == 4
