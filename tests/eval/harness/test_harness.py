"""``dllm.eval.harness``: the lm-eval model ``dllm`` on the stress tasks, its generation and its settings."""

import json
import os
import sys
import tempfile

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before lm-eval imports datasets: everything is local
os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(tempfile.gettempdir(), "dllm-test-datasets-cache"))

import pytest  # noqa: E402

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

import dllm  # noqa: E402
from dllm import tasks as T  # noqa: E402
from dllm.eval import harness as H  # noqa: E402
from dllm.scoring.exact_match import decode_and_score, eval_examples  # noqa: E402
from dllm.eval.harness.config import HARNESS_KEYS, split_model_args  # noqa: E402
from dllm.eval.harness.tasks import DATA_ENV, lm_task_name, write_task_files  # noqa: E402
from dllm.models import load  # noqa: E402

# C = 0 and C > 0 tasks on which tiny-llada is exact on some examples and wrong on others
TASKS = ("copy", "sort_num", "pick_pair", "latin4_r1", "shuffle_2tok", "insert_random_2tok")
PER_SIZE = 2


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm_tasks_data")
    write_task_files(folder, per_size=PER_SIZE, tasks=TASKS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(DATA_ENV, str(folder))
        yield folder


@pytest.fixture(scope="module")
def manager():
    return H.task_manager(include_defaults=False)


@pytest.fixture(scope="module")
def model():
    return load("tiny-llada", dtype="float32")


def harness_accuracy(manager, tasks, **model_args) -> dict[str, float]:
    lm = H.DllmLM(pretrained="tiny-llada", dtype="float32", device="cpu", **model_args)
    res = lm_eval.simple_evaluate(model=lm, tasks=[lm_task_name(t) for t in tasks], task_manager=manager)
    assert {k: res["n-samples"][lm_task_name(k)]["effective"] for k in tasks} == {
        k: PER_SIZE * len(T.get_task(k).default_sizes) for k in tasks}
    return {t: res["results"][lm_task_name(t)]["exact_match,none"] for t in tasks}


@pytest.mark.slow
@pytest.mark.parametrize("sampler, options", [
    ("low_confidence", {}),  # one token per step, one block
    ("fast", {"cache": "dual", "block_length": 4, "tau_conf": 0.7}),  # adaptive, blocks, cache, an option
], ids=["low_confidence", "fast-dual"])
def test_harness_accuracy_equals_exact_match(data_dir, manager, model, sampler, options):
    got = harness_accuracy(manager, TASKS, sampler=sampler, batch_size=5, **options)
    tally = decode_and_score(model, eval_examples(TASKS, per_size=PER_SIZE), sampler, **options)
    assert got == tally.accuracy
    assert 0 < sum(got.values()) < len(TASKS)  # some tasks right, some wrong: equality says something


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
def test_command_line_writes_results(data_dir, tmp_path, monkeypatch):
    """``python -m dllm.eval.harness`` = lm-eval's CLI with the model and the task dir (lm-eval's own
    tasks are not indexed here: that takes seconds and is lm-eval's business)."""
    import lm_eval.tasks

    class StressOnly(lm_eval.tasks.TaskManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "include_defaults": False})

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", StressOnly)
    monkeypatch.setattr(sys, "argv", ["dllm-harness"])  # lm-eval's parser reads sys.argv; main sets it
    H.main(["--model", "dllm", "--model_args", "pretrained=tiny-llada,sampler=fast,dtype=float32",
            "--tasks", "stress_copy", "--device", "cpu", "--batch_size", "4", "--output_path", str(tmp_path)])
    (path,) = tmp_path.rglob("results_*.json")
    res = json.loads(path.read_text())
    assert res["results"]["stress_copy"]["exact_match,none"] == 1.0  # tiny-llada copies exactly
    assert res["config"]["model"] == "dllm"


# ---- generate_until ------------------------------------------------------------------------------------
def _gen(ctx: str, **gen_kwargs) -> Instance:
    return Instance("generate_until", {}, (ctx, gen_kwargs), 0)


def test_generate_until_cuts_stops_and_respects_max_gen_toks():
    lm = H.DllmLM(pretrained="tiny-llada", dtype="float32", device="cpu", batch_size=2)
    exs = T.test_split("copy", 4, n=3)  # tiny-llada copies these exactly in L_ans = 5 positions
    la = T.answer_length("copy", 4)
    prompts = [" ".join(T.prompt_words(ex)) for ex in exs]
    raw = lm.generate_until([_gen(p, until=[], keep_special_tokens=True, max_gen_toks=la) for p in prompts])
    cut = lm.generate_until([_gen(p, until=[], max_gen_toks=la) for p in prompts])
    stop = lm.generate_until([_gen(p, until=[ex.answer[2]], max_gen_toks=la) for p, ex in zip(prompts, exs)])
    short = lm.generate_until([_gen(p, max_gen_toks=2) for p in prompts])
    for ex, r, c, s, sh in zip(exs, raw, cut, stop, short):
        assert r.split() == list(T.target_words(ex))  # the whole region, special tokens kept
        assert c == " ".join(ex.answer)  # cut at EOS, no special tokens
        assert s == " ".join(ex.answer[:2]) + " "  # cut before the stop string
        assert len(sh.split()) <= 2  # max_gen_toks caps the canvas
    assert lm.generate_until([]) == []


def test_sampled_generation_independent_of_batching_and_repeats_differ():
    """lm-eval's ``repeats`` hands the same request n times: with sampling each copy is its own draw
    (they were all one draw at --batch_size 1, the seed restarting every call), and a request's
    text does not depend on the batch it shares or on the order of the requests."""
    ex = T.test_split("copy", 4, n=1)[0]
    prompt = " ".join(T.prompt_words(ex))
    reqs = [_gen(prompt, until=[], do_sample=True, temperature=3.0, max_gen_toks=8)] * 4
    reqs.append(_gen(" ".join(T.prompt_words(T.test_split("copy", 4, n=2)[1])), until=[], do_sample=True,
                     temperature=3.0, max_gen_toks=8))
    one = H.DllmLM(pretrained="tiny-llada", dtype="float32", device="cpu", batch_size=1)
    alone = one.generate_until(reqs, disable_tqdm=True)
    assert len(set(alone[:4])) > 1, alone  # the copies are separate samples
    four = H.DllmLM(pretrained="tiny-llada", dtype="float32", device="cpu", batch_size=4)
    assert four.generate_until(reqs, disable_tqdm=True) == alone
    assert four.generate_until(reqs[::-1], disable_tqdm=True) == [alone[4], *alone[:4]]  # k-th copy: k-th draw


def test_block_causal_model_decodes_on_its_grid_in_any_batch():
    """SDAR (block-causal, trained block 4): generate_until decoded with block_length = the canvas
    (refused: not the trained block) and batched prompts of lengths that end at different offsets in
    the block grid (refused); the greedy check of loglikelihood asked for blocks of the answer's length.
    Now each request decodes as ``dllm.generate`` decodes it alone, on the model's grid."""
    from dllm.engine import generate

    lm = H.DllmLM(pretrained="tiny-random-sdar", dtype="float32", device="cpu", batch_size=4, gen_length=6,
                  mc_num=2)
    words = lm.tokenizer.decode(list(range(60, 70))).split()
    prompts = [" ".join(words[:n]) for n in (3, 4, 5, 7)]
    texts = lm.generate_until([_gen(p, until=[]) for p in prompts] + [_gen(prompts[0], until=[], max_gen_toks=2)],
                              disable_tqdm=True)
    for p, g, text in zip(prompts + prompts[:1], (6, 6, 6, 6, 2), texts):
        plan = lm.plan_generation(p, {"until": [], "max_gen_toks": g})
        alone = generate(lm.model, [plan.ids], gen_length=g).generated[0].tolist()
        assert text == lm.region_text(alone, plan)
    reqs = [Instance("loglikelihood", {}, (prompts[i], " " + words[i]), 0) for i in range(3)]
    assert len(lm.loglikelihood(reqs, disable_tqdm=True)) == 3


def test_cut_at_stops_and_steps():
    assert H.cut_at_stops("a b c d", ["c", "b"]) == "a "
    assert H.cut_at_stops("a b", ["x", ""]) == "a b"
    assert H.steps_for(10, 4, 2) == 3 * 2 and H.steps_for(10, 4, None) is None


def test_chat_template():
    """lm-eval's --apply_chat_template renders the model's template (the random LLaDA's tokenizer has
    LLaDA's chat tokens); the word-level task models have none and say so instead of rendering words
    their tokenizer does not know."""
    chat = [{"role": "user", "content": "copy A B"}]
    random_llada = dllm.load("tiny-random-llada", dtype="float32")
    lm = H.DllmLM(pretrained="tiny-random-llada", dtype="float32", device="cpu")
    text = lm.apply_chat_template(chat)
    assert text == random_llada.render_chat(chat) and text.startswith("<|startoftext|><|start_header_id|>user")
    assert lm.chat_template(True) == random_llada.chat_template and lm.chat_template(False) is None
    assert lm.tokenizer_name and "/" not in lm.tokenizer_name
    task_lm = H.DllmLM(pretrained="tiny-llada", dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="model 'tiny-llada' has no chat template"):
        task_lm.apply_chat_template(chat)


# ---- model_args ----------------------------------------------------------------------------------------
def test_model_args_split_between_harness_and_sampler():
    cfg, opts = split_model_args({"pretrained": "tiny-llada", "sampler": "threshold", "threshold": 0.8,
                                  "batch_size": "4", "max_batch_size": 64, "temperature": 0})
    assert (cfg.sampler, cfg.batch_size, cfg.temperature, opts) == ("threshold", 4, 0.0, {"threshold": 0.8})


def test_multi_option_cache_through_lm_evals_model_args(model):
    """lm-eval splits model_args at commas: a cache with several options is written with semicolons or
    as cache_<option> keys; both decode exactly as generate with the comma spec does."""
    from dllm.engine import generate

    want = "dual:look_back=16,look_ahead=16"
    for arg in ("cache=dual:look_back=16;look_ahead=16", "cache=dual,cache_look_back=16,cache_look_ahead=16"):
        lm = H.DllmLM.create_from_arg_string(f"pretrained=tiny-llada,dtype=float32,device=cpu,block_length=4,{arg}")
        assert lm.config.cache == want and lm.setting.cache == want
    rows = [T.prompt_ids(ex) for ex in T.test_split("copy", 4, n=2)]
    ref = generate(model, rows, "low_confidence", gen_length=8, block_length=4, cache=want)
    assert lm.decode(rows, 8, 0.0) == ref.generated.tolist()
    with pytest.raises(ValueError, match="look_ahead") as err:  # the comma form: lm-eval cut it in two
        H.DllmLM.create_from_arg_string("pretrained=tiny-llada,cache=dual:look_back=16,look_ahead=16")
    assert "cache_<option>" in str(err.value)
    with pytest.raises(ValueError, match=r"cache option\(s\) \['look_back'\] set twice"):
        H.DllmLM.create_from_arg_string("pretrained=tiny-llada,cache=dual:look_back=16,cache_look_back=8")
    with pytest.raises(ValueError, match="Unknown option.*'bogus' for cache policy 'dual'"):
        H.DllmLM.create_from_arg_string("pretrained=tiny-llada,cache=dual:look_back=16;bogus=1")


def test_an_option_in_the_spec_and_as_a_key_is_an_error():
    with pytest.raises(ValueError, match=r"sets \['threshold'\] twice"):
        split_model_args({"pretrained": "tiny-llada", "sampler": "threshold:threshold=0.9", "threshold": 0.8})
    with pytest.raises(ValueError, match="sets k=2 and k=4 is given too"):
        split_model_args({"pretrained": "tiny-llada", "sampler": "low_confidence:k=2", "tokens_per_step": 4})
    cfg, opts = split_model_args({"pretrained": "tiny-llada", "sampler": "low_confidence:k=2"})
    assert opts == {} and cfg.sampler == "low_confidence:k=2"


def test_unknown_model_args_key_lists_valid_keys():
    with pytest.raises(ValueError, match="unknown model_args key") as err:
        H.DllmLM.create_from_arg_string("pretrained=tiny-llada,sampler=threshold,treshold=0.8")
    msg = str(err.value)
    assert "'treshold'" in msg and all(k in msg for k in HARNESS_KEYS) and "threshold, stats" in msg


def test_bad_sampler_cache_and_values_are_clear_errors():
    with pytest.raises(ValueError, match="sampler='nope'.*Unknown sampler 'nope'. Valid samplers: .*low_confidence"):
        split_model_args({"pretrained": "tiny-llada", "sampler": "nope"})
    with pytest.raises(ValueError, match="Unknown cache policy 'nope'"):
        split_model_args({"pretrained": "tiny-llada", "cache": "nope"})
    with pytest.raises(ValueError, match="k applies to fixed-step samplers only"):
        split_model_args({"pretrained": "tiny-llada", "sampler": "fast", "tokens_per_step": 2})
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1 \\('auto' is not supported\\)"):
        split_model_args({"pretrained": "tiny-llada", "batch_size": "auto"})
    with pytest.raises(ValueError, match="needs pretrained=NAME"):
        split_model_args({"sampler": "fast"})
    with pytest.raises(ValueError, match="mc_num must be an integer >= 1, got 0"):
        split_model_args({"pretrained": "tiny-llada", "mc_num": 0})


def test_cli_device_falls_back_but_model_args_device_is_strict():
    lm = H.DllmLM.create_from_arg_obj({"pretrained": "tiny-llada", "dtype": "float32"},
                                      {"device": "cuda:7", "batch_size": 1, "max_batch_size": None})
    assert lm.device.type in ("cpu", "cuda") and lm.config.batch_size == 1
    with pytest.raises(ValueError, match="device 'cuda:7'"):
        H.DllmLM.create_from_arg_obj({"pretrained": "tiny-llada", "device": "cuda:7"}, {})


@pytest.mark.slow  # lm-eval indexes its own task folder first: tens of seconds
def test_command_line_bad_model_args_is_one_line_and_status_2():
    """A bad ``model_args`` value through ``python -m dllm.eval.harness``: one line naming it, exit 2."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "dllm.eval.harness", "--model", "dllm", "--model_args",
                           "pretrained=oracle,sampler=nope", "--tasks", "stress_copy", "--limit", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: model_args sampler='nope': Unknown sampler 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
