"""``load_target``: a transformers causal LM by directory or name, its tokenizer, and the refusals
(diffusion checkpoints, DFlash drafter directories, missing weights, nothing there); the lazy
public names of ``dllm.drafters`` and the package root."""

import json

import pytest
import torch

from dllm.models.targets import load_target, resolve_target
from dllm.models import ModelNotFoundError
from dllm.models.text.tokenizer import build_word_tokenizer, save_tokenizer
from tests.drafters.speculative_helpers import tiny_target

WORDS = "the a cat dog sat on mat ran to and it was big small red blue".split()


def _save(directory, *, tokenizer=True, vocab=32, **kw):
    model = tiny_target(vocab=vocab, hidden=32, **kw)
    model.save_pretrained(directory)
    if tokenizer:
        save_tokenizer(build_word_tokenizer(WORDS, ["<pad>", "<eos>"], eos_token="<eos>", pad_token="<pad>"), directory)
    return model


def test_loads_the_model_and_its_tokenizer(tmp_path):
    ref = _save(tmp_path)
    model, tok = load_target(tmp_path)
    assert type(model).__name__ == "Qwen3ForCausalLM" and not model.training and model.dtype == torch.float32
    assert tok is not None and tok.convert_tokens_to_ids("cat") == 5 and tok.eos_token == "<eos>"
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits)
    half, _ = load_target(str(tmp_path), dtype="bfloat16")
    assert half.dtype == torch.bfloat16


def test_a_directory_without_tokenizer_files_gives_none(tmp_path):
    _save(tmp_path, tokenizer=False)
    model, tok = load_target(tmp_path)
    assert tok is None and model.config.vocab_size == 32


def test_a_diffusion_checkpoint_is_refused_with_the_drafter_hint():
    with pytest.raises(ValueError, match=r"not a transformers causal LM \(architectures \['LLaDAModelLM'\], "
                                         r"model_type 'llada'\).*AutoModelForCausalLM.*dlm:model="):
        load_target("tiny-random-llada")


def test_a_dflash_drafter_directory_is_refused(tmp_path):
    hf = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 1,
          "num_target_layers": 2, "dflash_config": {"target_layer_ids": [1], "mask_token_id": 31}}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=r"architectures \['DFlashDraftModel'\].*Qwen3ForCausalLM.*dflash:model=DIR"):
        resolve_target(tmp_path)  # refused from config.json alone, before any weight is read


def test_a_base_model_without_lm_head_is_refused(tmp_path):
    from transformers import Qwen3Model

    Qwen3Model(tiny_target(vocab=32, hidden=32).config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"architectures \['Qwen3Model'\]"):
        load_target(tmp_path)


def test_missing_weights_are_an_error_not_random(tmp_path):
    from safetensors.torch import load_file, save_file

    _save(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["lm_head.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks 1 weight\(s\) of Qwen3ForCausalLM \(lm_head.weight\)"):
        load_target(tmp_path)


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    _save(tmp_path, vocab=8)
    with pytest.raises(ValueError, match=r"tokenizer has 19 tokens but the model's embedding has 8 rows"):
        load_target(tmp_path)


def test_nothing_there(tmp_path):
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        load_target(tmp_path)
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(ModelNotFoundError, match="is a file"):
        load_target(tmp_path / "weights.bin")
    with pytest.raises(ModelNotFoundError, match=r"cannot load target 'nobody/no-such-model'.*Embedded models:"):
        load_target("nobody/no-such-model")  # a Hub id; the tests run with HF_HUB_OFFLINE=1
    with pytest.raises(ValueError, match="not a device name"):
        load_target("tiny-random-llada", device="not-a-device")


def test_public_names_resolve_lazily():
    import dllm
    import dllm.drafters as drafters
    from dllm.drafters import base, loop, output, verify
    from dllm.models import targets as loading

    assert dllm.speculative_generate is drafters.speculative_generate is loop.speculative_generate
    assert dllm.load_target is drafters.load_target is loading.load_target
    assert dllm.make_drafter is base.make_drafter and dllm.list_drafters is base.list_drafters
    assert dllm.SpeculativeOutput is output.SpeculativeOutput is drafters.SpeculativeOutput
    for name in ("register_drafter", "Drafter", "Draft", "DraftContext", "DraftSession", "DraftSetup", "TargetInfo"):
        assert getattr(drafters, name) is getattr(base, name), name
    assert drafters.greedy_verify is verify.greedy_verify and drafters.SamplingParams is verify.SamplingParams
    assert set(drafters.__all__) <= set(dir(drafters))
    assert {"ngram", "dlm"} <= {n for n, _ in dllm.list_drafters()}
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        drafters.nope
