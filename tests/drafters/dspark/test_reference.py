"""``dspark`` against the transcription of the authors' code (``tests/reference/decoders/dspark_generate.py``,
DeepSpec ``Qwen3DSparkModel`` + ``build_dspark_proposal`` + ``generate_decoding_sample``), on checkpoints
written in the authors' format and read by both: per round the same drafted tokens, the same verify
length (the confidence-threshold rule) and the same accepted drafts, and the same output (= the
target's greedy), on 20 prompts x 3 settings (vanilla / gated / rnn Markov heads, confidence head with
and without the Markov embedding, thresholds 0, 0.5, 0.7), plus the shipped ``tiny-ar-dspark``."""

import pytest
import torch

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.drafters.dspark.io import load_dspark, random_dspark, save_dspark
from dllm.drafters.dspark.model import DSparkHeads
from dllm.drafters.loop import speculative_generate
from dllm.models.loading import locate
from tests.drafters.speculative_helpers import hf_greedy
from tests.reference.decoders.dspark_generate import Qwen3DSparkModel, ref_dspark_generate

NEW = 24
EOS = 4
SETTINGS = {
    "vanilla-t0": (DSparkHeads(markov_rank=16, markov_head_type="vanilla", enable_confidence_head=True,
                               confidence_head_with_markov=True), 0.0),
    "gated-t0.5": (DSparkHeads(markov_rank=16, markov_head_type="gated", enable_confidence_head=True), 0.5),
    "rnn-t0.7": (DSparkHeads(markov_rank=16, markov_head_type="rnn", enable_confidence_head=True,
                             confidence_head_with_markov=True), 0.7),
}


@pytest.fixture(scope="module")
def setup(tiny_pair):
    target, tok, _ = tiny_pair
    vocab = tok.get_vocab()
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for name in ("copy_long", "reverse_long", "double_long")
               for ex in T.test_split(name, None, n=7)][:20]
    return target, prompts, [hf_greedy(target, p, NEW, eos=EOS) for p in prompts]


def recorded(drafter):
    """The drafter with every round's (tokens, verify length) recorded in ``drafter.rounds``."""
    drafter.rounds = []
    begin = drafter.begin

    def recording_begin(setup):
        session = begin(setup)
        propose = session.propose

        def rec(ctx):
            draft = propose(ctx)
            n = draft.tokens.shape[1] if draft.lengths is None else int(draft.lengths[0])
            drafter.rounds.append((draft.tokens[0].tolist(), n))
            return draft

        session.propose = rec
        return session

    drafter.begin = recording_begin
    return drafter


def spiky(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.markov_head.parameters():
            p.normal_(0.0, 0.5, generator=g)
        model.confidence_head.proj.weight.normal_(0.0, 0.08, generator=g)  # logits ~ N(1, 0.9): varied lengths
        model.confidence_head.proj.bias.fill_(1.0)
    return model


def compare(target, directory, threshold, prompts, truth):
    ref = Qwen3DSparkModel.from_pretrained(directory, attn_implementation="sdpa").float().eval()
    drafter = recorded(make_drafter("dspark", model=load_dspark(directory),
                                    verify_length=f"threshold:threshold={threshold}"))
    lengths = set()
    for p, want in zip(prompts, truth):
        drafter.rounds.clear()
        out = speculative_generate(target, drafter, [p], max_new_tokens=NEW)
        gen, rounds = ref_dspark_generate(ref, target, torch.tensor([p]), NEW, [EOS], threshold)
        assert out.generated[0] == want == gen[:NEW]
        assert len(rounds) >= len(drafter.rounds)  # the authors' loop may run one more round past max_new_tokens
        for i, ((tokens, n), (ref_tokens, ref_n, ref_acc)) in enumerate(zip(drafter.rounds, rounds)):
            assert n == ref_n, f"round {i}: verify length {n} != the reference's {ref_n}"
            assert tokens == ref_tokens[:len(tokens)], f"round {i}: drafts {tokens} != {ref_tokens}"
            if i < len(drafter.rounds) - 1:  # the last round may be cut by max_new_tokens
                assert out.acceptance[0][i] == ref_acc + 1
            lengths.add(n)
    return lengths


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_token_identical_to_the_authors_rule(setup, setting, tmp_path):
    target, prompts, truth = setup
    heads, threshold = SETTINGS[setting]
    model = spiky(random_dspark(target, 2, 7, 1, heads=heads, seed=3, target_layer_ids=(1, 3)), 5)
    save_dspark(model, tmp_path)
    lengths = compare(target, tmp_path, threshold, prompts, truth)
    if threshold > 0:  # the schedule really cut: short and full verify lengths were both used
        assert len(lengths) >= 2 and min(lengths) < 7, lengths


@pytest.mark.slow
def test_the_shipped_checkpoint_matches_the_reference(setup):
    target, prompts, truth = setup
    try:
        directory = locate("tiny-ar-dspark")
    except Exception:  # noqa: BLE001
        pytest.skip("tiny-ar-dspark is not shipped")
    lengths = compare(target, directory, 0.6, prompts, truth)
    assert len(lengths) > 1
