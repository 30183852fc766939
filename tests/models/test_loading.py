"""load(): embedded names, local directories, Hub ids offline, dtype/device_map, and clear errors."""

import json
import re
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllm.models import CheckpointError, Dream, LLaDA, ModelNotFoundError, embedded_names, load, tiny
from dllm.models.loading import EMBEDDED_DIR

from .helpers import assert_regenerated, random_ids


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


def _edit_weights(path, fn):
    f = path / "model.safetensors"
    tensors = load_file(str(f))
    fn(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})


# ---- embedded models ---------------------------------------------------------------------------

def test_embedded_models_load_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert {"tiny-random-llada", "tiny-random-dream"} <= set(embedded_names())
    llada, dream = load("tiny-random-llada"), load("tiny-random-dream")
    assert isinstance(llada, LLaDA) and isinstance(dream, Dream)
    assert llada.family == "llada" and dream.family == "dream"
    assert llada.dtype == torch.float32 and llada.tokenizer is not None
    assert llada.hf_config["model_type"] == "llada" and dream.hf_config["model_type"] == "Dream"
    ids = torch.tensor([llada.generation_prompt("what is 1 plus 2 ?", chat=True)])
    assert llada(ids).logits.shape == (1, ids.shape[1], llada.vocab_size)


def test_embedded_files_are_small_and_match_the_generator(tmp_path):
    from dllm.models.loading import EMBEDDED_DIR
    from dllm.models.make_embedded import EMBEDDED, write_embedded

    write_embedded(tmp_path)
    for name in EMBEDDED:
        shipped, fresh = EMBEDDED_DIR / name, tmp_path / name
        assert sum(f.stat().st_size for f in shipped.iterdir()) < 1_000_000
        assert sorted(f.name for f in shipped.iterdir()) == sorted(f.name for f in fresh.iterdir())
        for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            assert (shipped / f).read_text() == (fresh / f).read_text(), f
        a, b = load_file(str(shipped / "model.safetensors")), load_file(str(fresh / "model.safetensors"))
        assert_regenerated(a, b)


@pytest.mark.parametrize("name", [n for n in embedded_names() if (EMBEDDED_DIR / n / "tokenizer_config.json").is_file()])
def test_embedded_tokenizer_configs_load_on_transformers_4_and_5(name):
    """transformers 5 writes ``TokenizersBackend`` and a list of ``extra_special_tokens``, which 4.x
    (allowed by the dependency floor) does not know: ``load_target("tiny-ar")`` failed on 4.57.6.
    The shipped files name ``PreTrainedTokenizerFast`` (both read it) and ``additional_special_tokens``."""
    cfg = json.loads((EMBEDDED_DIR / name / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert not isinstance(cfg.get("extra_special_tokens"), list)


def test_device_map_auto_on_cpu():
    model = load("tiny-random-dream", device_map="auto")
    reference = load("tiny-random-dream")
    ids = random_ids(model, 2, 7)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert load("tiny-random-llada", device_map={"": "cpu"}).device.type == "cpu"
    with pytest.raises(ValueError, match="device_map must be 'auto' or a dict"):
        load("tiny-random-llada", device_map="cpu")
    with pytest.raises(ValueError, match="either device"):
        load("tiny-random-llada", device="cpu", device_map="auto")


def test_dtype_options():
    assert load("tiny-random-llada", dtype="bfloat16").dtype == torch.bfloat16
    assert load("tiny-random-llada", dtype="auto").dtype == torch.float32
    assert load("tiny-random-dream", dtype=torch.float16).dtype == torch.float16
    with pytest.raises(ValueError, match="dtype 'float8' is not supported; valid: .*bfloat16"):
        load("tiny-random-llada", dtype="float8")


def test_bad_dtype_names_the_valid_ones(tmp_path):
    for dtype in (torch.int32, torch.bool, torch.complex64):
        with pytest.raises(ValueError, match=rf"dtype {dtype} is not supported: .*torch.float32, torch.bfloat16"):
            load("tiny-random-llada", dtype=dtype)
    with pytest.raises(ValueError, match=r"dtype 'int32' is not supported; valid: .*bfloat16"):
        load("tiny-random-llada", dtype="int32")
    tiny("llada").save_pretrained(tmp_path)
    _edit_config(tmp_path, torch_dtype="int8")
    with pytest.raises(ValueError, match=r"config.json torch_dtype 'int8' is not supported"):
        load(tmp_path)
    assert load("tiny-random-llada", dtype="float64").dtype == torch.float64


def test_missing_device_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:1", torch.device("cuda", 0)):
        with pytest.raises(ValueError, match=r"CUDA is not available \(.*\); available devices: cpu"):
            load("tiny-random-llada", device=device)
        with pytest.raises(ValueError, match="CUDA is not available"):
            load("oracle", device=device)
    with pytest.raises(ValueError, match=r"device 'gpu0' is not a device name; available devices: cpu"):
        load("tiny-random-llada", device="gpu0")
    for device in ("meta", "xla"):  # names torch knows, devices dllm does not run on
        with pytest.raises(ValueError, match=rf"device '{device}': dllm runs on cpu, cuda or mps; available devices"):
            load("tiny-random-llada", device=device)
    assert load("tiny-random-llada", device="cpu").device == torch.device("cpu")


@pytest.mark.parametrize("weight_map", [[["a", "b"]], None, {"model.embed": None}, {"model.embed": 3}, "x"])
def test_a_malformed_shard_index_names_the_file(tmp_path, weight_map):
    from dllm.models.checkpoint import INDEX_FILE

    tiny("llada").save_pretrained(tmp_path, max_shard_size=20_000)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / INDEX_FILE)) + ".*weight_map"):
        load(tmp_path)


def test_attn_backend_choice():
    assert load("tiny-random-llada", attn_backend="reference").attn_backend == "reference"
    # "auto" measures sdpa against triton per shape where both can run (a CUDA machine with triton)
    assert load("tiny-random-llada").attn_backend in (("sdpa", "auto") if torch.cuda.is_available() else ("sdpa",))


# ---- not found -----------------------------------------------------------------------------------

def test_nonexistent_path_is_fast_and_clear(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match=r"(?s)'/no/such/dir'.*tiny-random-dream, tiny-random-fastdllm-v2, tiny-random-llada"):
        load("/no/such/dir")
    pattern = r"(?s)'nobody/no-such-model'.*HF_HUB_OFFLINE.*tiny-random-llada"
    with pytest.raises(ModelNotFoundError, match=pattern) as info:
        load("nobody/no-such-model")
    assert time.perf_counter() - start < 5
    assert isinstance(info.value, FileNotFoundError)
    err = info.value  # no chained HTTP errors in the traceback
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__)


def test_unknown_hub_id_without_offline_flag_fails_cleanly(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="Embedded models"):
        load("nobody/no-such-model-xyz")
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("name", ["", " ", "\t\n"])
def test_empty_name_is_refused_before_any_lookup(monkeypatch, name):
    """``Path("")`` is the current directory: an empty name used to read as "directory '' exists
    but has no config.json" (or to be looked up on the Hub when only blanks)."""
    import dllm

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the refusal must not depend on the Hub
    start = time.perf_counter()
    pattern = rf"the model name is empty \({re.escape(repr(name))}\); give an embedded model \(.*tiny-llada.*\), a local checkpoint"
    with pytest.raises(ModelNotFoundError, match=pattern):
        load(name)
    with pytest.raises(ModelNotFoundError, match=pattern):
        dllm.load_target(name)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("value", [None, 5])
def test_a_name_that_is_not_text_is_a_type_error(value):
    with pytest.raises(TypeError, match=rf"name_or_path must be a model name or a path, got {type(value).__name__}"):
        load(value)


def test_loaded_models_know_their_name():
    assert load("tiny-llada").name_or_path == "tiny-llada" and tiny("llada").name_or_path == ""


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        load(tmp_path)


# ---- bad checkpoints ------------------------------------------------------------------------------

def test_unknown_model_type(saved):
    _edit_config(saved, model_type="gpt2")
    with pytest.raises(ValueError, match=r"unsupported model_type 'gpt2'.*Dream, Fast_dLLM_Qwen, dream, llada"):
        load(saved)


def test_an_autoregressive_checkpoint_points_to_the_speculative_loop():
    """The shipped AR target (qwen3) loaded as a diffusion model: the error says what it is for."""
    with pytest.raises(ValueError, match=r"unsupported model_type 'qwen3'.*autoregressive model.*dllm spec --target"):
        load("tiny-ar")


def test_missing_required_config_field(saved, family):
    field = "d_model" if family == "llada" else "hidden_size"
    _edit_config(saved, **{field: ..., "rope_theta": ...})
    with pytest.raises(ValueError, match=rf"missing required field\(s\): {field}, rope_theta"):
        load(saved)


def test_missing_weight(saved, family):
    key = "model.transformer.blocks.1.up_proj.weight" if family == "llada" else "model.layers.1.mlp.up_proj.weight"
    _edit_weights(saved, lambda t: t.pop(key))
    with pytest.raises(CheckpointError, match=rf"missing keys \(1\): {key}"):
        load(saved)


def test_unexpected_and_misshaped_weights_in_one_error(saved, family):
    key = "model.transformer.blocks.0.q_proj.weight" if family == "llada" else "model.layers.0.self_attn.q_proj.weight"

    def damage(t):
        t[key] = torch.zeros(64, 60)
        t["extra.weight"] = torch.zeros(2)

    _edit_weights(saved, damage)
    with pytest.raises(CheckpointError) as info:
        load(saved)
    msg = str(info.value)
    assert "unexpected keys (1): extra.weight" in msg
    assert f"mis-shaped key {key}: expected [64, 64], found [64, 60]" in msg


def test_non_finite_weights_are_refused_naming_the_tensors(saved, family):
    prefix = "model.transformer.blocks" if family == "llada" else "model.layers"
    a, b = f"{prefix}.0.attn_norm.weight" if family == "llada" else f"{prefix}.0.input_layernorm.weight", (
        f"{prefix}.1.up_proj.weight" if family == "llada" else f"{prefix}.1.mlp.up_proj.weight")

    def damage(t):
        t[a][3] = float("nan")
        t[b][0, :2] = float("inf")

    _edit_weights(saved, damage)
    with pytest.raises(CheckpointError, match="non-finite weights in 2 tensor") as info:
        load(saved)
    msg = str(info.value)
    assert f"{a}: 1 NaN, 0 inf of 64 values" in msg and f"{b}: 0 NaN, 2 inf" in msg


def test_weights_that_overflow_the_requested_dtype_are_refused(saved, family):
    key = "model.transformer.ln_f.weight" if family == "llada" else "model.norm.weight"
    _edit_weights(saved, lambda t: t[key].__setitem__(0, 1e6))  # finite in float32, inf in float16
    assert load(saved).dtype == torch.float32
    pattern = rf"{key}: 0 NaN, 1 inf .*stored values are finite: they overflow torch.float16"
    with pytest.raises(CheckpointError, match=pattern):
        load(saved, dtype="float16")


def test_truncated_safetensors_names_the_file(saved):
    f = saved / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"cannot read safetensors file .*model\.safetensors.*truncated"):
        load(saved)


def test_missing_shard_names_the_file(tmp_path):
    tiny("llada").save_pretrained(tmp_path, max_shard_size=60_000)
    second = sorted(tmp_path.glob("model-*.safetensors"))[1]
    second.unlink()
    with pytest.raises(CheckpointError, match=f"{second.name}' does not exist"):
        load(tmp_path)


def test_tokenizer_larger_than_embedding(saved, family):
    rows = {"vocab_size": 64} if family == "dream" else {"vocab_size": 64, "embedding_size": 64}
    _edit_config(saved, **rows)
    pattern = r"vocabulary mismatch .* tokenizer has \d+ tokens but the model's embedding has 64 rows"
    with pytest.raises(ValueError, match=pattern):
        load(saved)


@pytest.mark.parametrize("field, value", [
    ("block_type", "sequential"), ("alibi", True), ("input_emb_norm", True), ("scale_logits", True),
    ("attention_layer_norm", True), ("multi_query_attention", True), ("include_bias", True),
])
def test_unsupported_llada_variants(tmp_path, field, value):
    tiny("llada").save_pretrained(tmp_path)
    _edit_config(tmp_path, **{field: value})
    with pytest.raises(NotImplementedError, match=rf"field {field} = {value!r} is not supported"):
        load(tmp_path)


def test_unsupported_dream_variant(tmp_path):
    tiny("dream").save_pretrained(tmp_path)
    _edit_config(tmp_path, rope_scaling={"type": "yarn", "factor": 4.0})
    with pytest.raises(NotImplementedError, match="rope_scaling"):
        load(tmp_path)


def test_special_ids_prefer_config_then_tokenizer_then_defaults():
    cfg, special = LLaDA.from_hf_config(dict(load("tiny-random-llada").hf_config, mask_token_id=7))
    assert special.mask_id == 7
    # no ids in config, no tokenizer: the family defaults, which must fit the vocabulary
    big = dict(load("tiny-random-dream").hf_config, vocab_size=152064)
    for k in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"):
        big.pop(k)
    _, ids = Dream.from_hf_config(big)
    assert (ids.mask_id, ids.eos_id, ids.pad_id, ids.bos_id, ids.eot_id) == (151666, 151643, 151643, 151643, 151645)
    small = dict(big, vocab_size=112)
    with pytest.raises(ValueError, match=r"mask_id comes from the family default 151666, which is outside"):
        Dream.from_hf_config(small)


def test_loading_a_checkpoint_imports_no_compiler():
    """The model is built on the meta device without nn.Embedding's normal_ init, whose meta kernel imports
    torch._dynamo (about a second of every ``dllm serve`` / ``dllm generate`` start)."""
    import subprocess
    import sys

    code = ("import sys, dllm; m = dllm.load('tiny-llada'); "
            "e = m.transformer.embed; print(type(e).__name__, e.weight.device, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["Embedding", "cpu", "False"]


def test_an_embedding_built_off_meta_keeps_torch_init():
    from dllm.models.core.transformer import embedding

    torch.manual_seed(3)
    ours = embedding(11, 4)
    torch.manual_seed(3)
    assert torch.equal(ours.weight, torch.nn.Embedding(11, 4).weight)
    with torch.device("meta"):
        meta = embedding(11, 4)
    assert meta.weight.is_meta and meta.weight.shape == (11, 4) and meta.weight.requires_grad
