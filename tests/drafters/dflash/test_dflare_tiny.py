"""The shipped DFlare drafter ``tiny-ar-dflare`` (``dllm/train/drafters/dflare_train.py``) for the tiny
AR target: it loads offline in the authors' layout through the ``dflash`` drafter, greedy decoding
equals ``target.generate``, and batch-1 runs are token-identical (and round-identical) to the transcribed
AngelSlim loop (``tests/reference/modelling/dflare_modeling.py``) on 27 prompts x 3 settings."""

import json
import shutil

import pytest
import torch

from dllm.drafters.base import make_drafter
from dllm.drafters.dflash.dflare.model import DFlareDrafter
from dllm.drafters.loop import speculative_generate
from dllm.models.loading import locate
from dllm.models.targets import load_target
from dllm.tasks.vocab import EOS, word_id
from tests.drafters.dflash.test_dflare import full_rounds, reference
from tests.drafters.speculative_helpers import long_answer_prompts
from tests.reference.modelling.dflare_modeling import ref_spec_generate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pair():
    target, tok = load_target("tiny-ar")
    return target, tok, make_drafter("dflash", model="tiny-ar-dflare")


def test_the_shipped_drafter_loads_in_the_authors_layout(pair):
    target, _, drafter = pair
    assert isinstance(drafter.model, DFlareDrafter)
    hf = json.loads((locate("tiny-ar-dflare") / "config.json").read_text())
    assert hf["architectures"] == ["QwenDFlareDraftModel"]
    assert drafter.target_layers == (0, 1, 2, 3) and drafter.block_size == 16  # every layer of the target
    w = drafter.model.layer_fusion_weights.softmax(dim=1)  # [2 layers, 4 taps], trained
    assert not torch.allclose(w[0], w[1], atol=0.05)  # the two layers learned different mixtures


def test_greedy_equals_target_generate_on_a_ragged_batch(pair):
    target, tok, drafter = pair
    exs, ids = long_answer_prompts(tok)
    out = speculative_generate(target, drafter, ids, max_new_tokens=66, tokenizer=tok)
    for row, prompt in enumerate(ids):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=66, do_sample=False)[0, len(prompt):].tolist()
        assert out.generated[row] == ref, exs[row].task
    assert out.tau > 4.0  # the trained drafter's drafts are accepted


@pytest.mark.parametrize("block, max_new, stop, tau", [(16, 66, True, 2.5), (16, 30, False, 2.5), (8, 66, True, 1.1)],
                         ids=["b16-stop", "b16-cut30", "b8-stop"])
def test_token_identical_to_the_reference_loop(pair, tmp_path, block, max_new, stop, tau):
    """27 prompts, batch 1: the same tokens as the transcribed AngelSlim ``spec_generate`` on the shipped
    weights loaded by it (block 8: the checkpoint's ``block_size`` rewritten, which both loops read), and
    the same accepted length in every round that verifies a whole block before the stop. (Trained on
    blocks of 16 only, the drafter accepts little at block 8, as ``tiny-ar-dflash`` does.)"""
    target, tok, _ = pair
    path = locate("tiny-ar-dflare")
    if block != 16:
        path = shutil.copytree(path, tmp_path / "ckpt")
        hf = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**hf, "block_size": block}))
    drafter, ref = make_drafter("dflash", model=str(path)), reference(path)
    assert drafter.block_size == ref.block_size == block
    _, ids = long_answer_prompts(tok, per_size=3)
    eos = [word_id(EOS)] if stop else []
    accepted = []
    for prompt in ids:
        ours = speculative_generate(target, drafter, [prompt], max_new_tokens=max_new, eos_token_id=eos)
        theirs, lengths = ref_spec_generate(ref, target, torch.tensor([prompt]), max_new, eos or None)
        assert ours.generated[0] == theirs[0, len(prompt):].tolist()
        n = min(full_rounds(lengths, block, max_new), len(ours.acceptance[0]) - 1)
        assert ours.acceptance[0][:n] == lengths[:n]
        accepted += lengths[:n]
    assert len(ids) >= 20 and sum(accepted) / len(accepted) > tau and max(accepted) >= 4  # multi-token rounds
