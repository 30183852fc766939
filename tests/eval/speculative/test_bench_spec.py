"""``dllm.eval.speculative.bench``: every method side by side at batch 1 on tiny random Qwen3 models."""

from __future__ import annotations

import json

import pytest
import torch

from dllm import tasks as T
from dllm.eval.speculative.bench import (METHODS, Method, acceptance_by_position, commits_from_starts, counting,
                                         format_table, main, parse_args, run_bench)

from speculative_models import MASK, tiny_qwen3

MAX_NEW = 12


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from dllm.drafters.dflash.io import random_dflash, save_dflash

    root = tmp_path_factory.mktemp("bench_spec")
    target, assistant = tiny_qwen3(2, 0), tiny_qwen3(1, 1)
    target.save_pretrained(root / "target")
    assistant.save_pretrained(root / "assistant")
    save_dflash(random_dflash(target, 1, 8, mask_token_id=MASK), root / "dflash")
    return target, {name: str(root / name) for name in ("target", "assistant", "dflash")}


def examples(n: int = 2) -> list[T.Example]:
    return T.test_split("copy_long", 32, n=n)


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
def test_every_method_side_by_side(models):
    target, paths = models
    methods = [Method("generate"), "ar", Method("dflash", paths["dflash"]), Method("assisted", paths["assistant"]),
               "prompt_lookup", "ngram", Method("dlm", "/no/such/diffusion-model")]
    rows = run_bench(target, methods, examples(), temperatures=(0.0, 1.0), max_new_tokens=MAX_NEW, progress=False,
                     block_size=8)
    assert [(r.method, r.temperature) for r in rows] == [(m, t) for t in (0.0, 1.0) for m in METHODS]
    by = {(r.method, r.temperature): r for r in rows}
    for r in rows:
        if r.method == "dlm":
            assert r.status == "skipped" and "no/such" in r.reason and r.tau is None
            continue
        assert r.status == "ok", r.reason
        assert r.prompts == 2 and r.target_forwards > 0 and r.generated_tokens > 0 and r.wall_s > 0
        assert r.tau == round(r.generated_tokens / r.target_forwards, 4)
        assert r.accuracy == 0.0  # random models do not copy
        assert r.acceptance is not None and len(r.acceptance) == 7 and r.speedup is not None
        if r.temperature == 0:
            assert r.greedy_match is True, r.method  # every method is lossless
            assert r.outputs == by[("generate", 0.0)].outputs
        else:
            assert r.greedy_match is None
    for t in (0.0, 1.0):
        assert by[("ar", t)].tau == 1.0 and by[("generate", t)].tau == 1.0
        assert by[("generate", t)].acceptance == [0.0] * 7 and by[("generate", t)].drafter_forwards == 0
        assert by[("assisted", t)].drafter_forwards > 0 and by[("dflash", t)].drafter_forwards > 0
    assert by[("generate", 0.0)].speedup == 1.0
    assert max(by[("dflash", 0.0)].tau, by[("ngram", 0.0)].tau, by[("prompt_lookup", 0.0)].tau) > 1.0
    table = format_table(rows)
    assert all(f"| {m} |" in table for m in METHODS) and "skipped (" in table


def test_failure_during_the_run_is_skipped(models):
    target, paths = models  # the drafter's trained block is 8: block 12 fails inside the first timed call
    rows = run_bench(target, ["generate", Method("dflash", paths["dflash"])], examples(1), temperatures=(0.0,),
                     max_new_tokens=4, progress=False, block_size=12, warmup=False)
    assert [r.status for r in rows] == ["ok", "skipped"]
    assert "trained block size 8" in rows[1].reason


def test_forward_counting_and_commits(models):
    target, _ = models
    ids = torch.tensor([[2, 5, 6, 7, 5, 6, 7, 5]])
    with counting(target) as starts:
        target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6, min_new_tokens=6,
                        prompt_lookup_num_tokens=4)
    assert [int(s) for s in starts][0] == 0 and sum(commits_from_starts(starts, 8, 6)) == 6
    assert commits_from_starts([0, 10, 13, 14], 10, 8) == [1, 3, 1, 3]  # anchors 9, 10, 13, 14; last ends at 17
    assert commits_from_starts([0, None], 10, 2) is None
    assert acceptance_by_position([1, 3, 2, 4], 4) == [0.75, 0.5, 0.25]


@pytest.mark.parametrize("argv, match", [
    (["--methods", "generate,medusa"], "valid methods: generate, ar, dflash"),
    (["--temperatures", "0,-1"], "temperatures must be finite numbers >= 0"),
    (["--temperatures", "hot"], "--temperatures must be numbers"),
    (["--n", "0"], "--n must be an integer >= 1"),
    (["--block-size", "0"], "--block-size must be an integer >= 1"),
    (["--tasks", "copy_lon"], "valid tasks: .*copy_long"),
    (["--methods", "ngram", "--drafter-options", "medusa:k=1"], "unknown drafter 'medusa'; registered: .*ngram"),
    (["--methods", "ngram", "--drafter-options", "dlm:steps=2"], "'dlm' is not among --methods ngram"),
    (["--methods", "ngram", "--drafter-options", "ngram:max_gram=2"], "max_gram.*max_ngram"),
    (["--methods", "ngram", "--drafter-options", "ngram:max_ngram=0"], "max_ngram must be an integer >= 1"),
    (["--tree", "nope"], "--tree 'nope': Unknown tree builder 'nope'. Valid tree builders: .*ddtree"),
    (["--tree", "ddtree:budget=0"], "--tree 'ddtree:budget=0': budget"),
    (["--tree", "ddtree", "--block-size", "auto"], "picks each prompt's tree itself"),
    (["--methods", "dflash", "--drafter-options", "dflash:model=/nonexistent"],
     r"--drafter-options '/nonexistent' \(for the dflash method\)"),
    (["--n", "51"], r"--n 51: the test split holds 50 instances per task size; give --n <= 50"),
])
def test_bad_flags(argv, match):
    with pytest.raises(ValueError, match=match):
        parse_args(argv)


def test_drafter_options_by_an_alias_reach_the_drafter_that_runs():
    """'prompt_lookup' is both transformers' method and an alias of the ngram drafter: its options were
    accepted with --methods prompt_lookup and given to ngram, which did not run (silently ignored), and
    refused with --methods ngram, which would have used them."""
    with pytest.raises(ValueError, match="'prompt_lookup' names the 'ngram' drafter; the 'prompt_lookup' method "
                                         "is transformers' and takes no drafter options"):
        parse_args(["--methods", "generate,prompt_lookup", "--drafter-options", "prompt_lookup:max_ngram=2"])
    args = parse_args(["--methods", "generate,ngram", "--drafter-options", "prompt_lookup:max_ngram=2",
                       "--drafter-options", "ngram:min_ngram=2"])
    assert args.drafter_options == {"ngram": {"max_ngram": 2, "min_ngram": 2}}


def test_bad_arguments_to_run_bench(models):
    target, _ = models
    with pytest.raises(ValueError, match="valid methods"):
        run_bench(target, ["generate", "eagle"], examples(1), progress=False)
    with pytest.raises(ValueError, match=">= 0"):
        run_bench(target, ["generate"], examples(1), temperatures=(-0.5,), progress=False)
    with pytest.raises(ValueError, match="once"):
        run_bench(target, ["ar", "ar"], examples(1), progress=False)


def test_defaults():
    args = parse_args([])  # the quick run: greedy, one prompt per size of copy_long
    assert args.methods == list(METHODS) and args.temperatures == [0.0] and args.n == 1
    assert args.tasks == ["copy_long"] and args.block_size == 16
    full = parse_args(["--full"])  # the whole table
    assert full.temperatures == [0.0, 1.0] and full.n == 4 and full.tasks == list(T.suite_task_names("long-answer"))
    assert parse_args(["--full", "--n", "2"]).n == 2  # an explicit flag wins over either


def test_a_drafter_that_is_not_there_is_refused_before_the_run(tmp_path):
    with pytest.raises(ValueError, match=r"--dflash '/nonexistent' \(for the dflash method\): .*Embedded models: "):
        parse_args(["--dflash", "/nonexistent"])
    with pytest.raises(ValueError, match="--assistant .* is a file"):
        (tmp_path / "f").write_text("")
        parse_args(["--assistant", str(tmp_path / "f")])
    parse_args(["--methods", "generate,ngram", "--dflash", "/nonexistent"])  # dflash not run: not checked


def test_main_writes_json(models, tmp_path, capsys):
    _, paths = models
    out = tmp_path / "spec.json"
    broken = tmp_path / "broken-dlm"  # a checkpoint directory that fails to load: the method is skipped
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    rc = main(["--target", paths["target"], "--dflash", paths["dflash"], "--assistant", paths["assistant"],
               "--dlm", str(broken), "--methods", "ar,dflash,dlm", "--tasks", "copy_long", "--n", "1",
               "--max-new-tokens", "5", "--temperatures", "0", "--block-size", "8", "--no-progress",
               "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| generate |" in printed and "| dflash |" in printed and "skipped (" in printed
    payload = json.loads(out.read_text())
    assert payload["prompts"] == 3 and payload["block_size"] == 8
    rows = {r["method"]: r for r in payload["rows"]}
    assert list(rows) == ["generate", "ar", "dflash", "dlm"]  # the baseline is always run
    assert rows["dflash"]["greedy_match"] is True and rows["dlm"]["status"] == "skipped"
    assert "outputs" not in rows["ar"]


def test_block_size_auto_runs_drafters_with_a_head_and_skips_the_others(models, tmp_path):
    """--block-size auto: each prompt's size from the drafter's block head; drafters without one are
    skipped with the loop's reason, and the acceptance columns span the largest size used."""
    import shutil

    from dllm.drafters.base import make_drafter
    from dllm.drafters.dflash.block_head import BlockHead

    target, paths = models
    head_dir = tmp_path / "dflash-with-head"
    shutil.copytree(paths["dflash"], head_dir)
    plain = make_drafter("dflash", model=paths["dflash"])
    BlockHead((2, 4), features=2 * len(plain.target_layers) * target.config.hidden_size).save(head_dir)
    rows = run_bench(target, ["generate", Method("dflash", str(head_dir)), "ngram"], examples(1),
                     temperatures=(0.0,), max_new_tokens=MAX_NEW, progress=False, block_size="auto")
    by = {r.method: r for r in rows}
    assert by["dflash"].status == "ok" and by["dflash"].greedy_match is True
    assert len(by["dflash"].acceptance) <= 3  # columns up to the most committed in a round (<= 4 here)
    assert by["ngram"].status == "skipped" and "has none" in by["ngram"].reason
    assert parse_args(["--block-size", "auto"]).block_size == "auto"


def test_ctrl_c_keeps_the_finished_temperatures(models, tmp_path, monkeypatch, capsys):
    """Ctrl-C during T = 1: the T = 0 rows printed and written, one line said, status 130."""
    from dllm.eval.speculative import runners

    _, paths = models
    real = runners.loop_runner

    def interrupting(*args, **kw):
        run = real(*args, **kw)

        def call(prompt, temperature, budget, seed):
            if temperature > 0:
                raise KeyboardInterrupt
            return run(prompt, temperature, budget, seed)

        return call

    monkeypatch.setattr(runners, "loop_runner", interrupting)
    out = tmp_path / "spec.json"
    rc = main(["--target", paths["target"], "--methods", "ar", "--tasks", "copy_long", "--n", "1",
               "--max-new-tokens", "5", "--temperatures", "0,1", "--no-progress", "--out", str(out)])
    assert rc == 130
    printed = capsys.readouterr().out
    assert f"interrupted: 2 finished rows are saved in {out}" in printed
    rows = json.loads(out.read_text())["rows"]
    assert [(r["method"], r["temperature"], r["status"]) for r in rows] == [("generate", 0.0, "ok"), ("ar", 0.0, "ok")]


def test_ctrl_c_before_any_row_says_nothing_was_written(models, tmp_path, monkeypatch, capsys):
    from dllm.eval.speculative import runners

    _, paths = models

    def interrupt_at_once(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(runners, "loop_runner", interrupt_at_once)
    out = tmp_path / "spec.json"
    rc = main(["--target", paths["target"], "--methods", "ar", "--tasks", "copy_long", "--n", "1",
               "--max-new-tokens", "5", "--no-progress", "--out", str(out)])
    assert rc == 130 and not out.exists()
    assert f"interrupted: no row finished; nothing written to {out}" in capsys.readouterr().out


def test_drafter_options_reach_the_drafter(models, capsys):
    """``--drafter-options`` gives a registered drafter its options (and model) in our loop; the
    per-method flags' values are overridden."""
    _, paths = models
    args = parse_args(["--methods", "generate,ngram,dflash", "--drafter-options", "ngram:max_ngram=2",
                       "--drafter-options", f"dflash:model={paths['dflash']}"])
    assert args.drafter_options == {"ngram": {"max_ngram": 2}, "dflash": {"model": paths["dflash"]}}
    rc = main(["--target", paths["target"], "--dflash", "/nonexistent", "--methods", "ngram,dflash",
               "--drafter-options", "ngram:max_ngram=2", "--drafter-options", f"dflash:model={paths['dflash']}",
               "--tasks", "copy_long", "--n", "1", "--max-new-tokens", "5", "--block-size", "8", "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0 and "skipped" not in printed
    assert "| ngram |" in printed and "| dflash |" in printed


def test_tree_flag_verifies_trees(models, tmp_path, capsys):
    """``--tree``: the drafter methods verify that builder's trees (greedy still equal to generate)."""
    _, paths = models
    out = tmp_path / "tree.json"
    rc = main(["--target", paths["target"], "--dflash", paths["dflash"], "--methods", "dflash", "--tree",
               "ddtree:budget=6", "--tasks", "copy_long", "--n", "1", "--max-new-tokens", "5", "--block-size", "8",
               "--no-progress", "--out", str(out)])
    assert rc == 0
    payload = json.loads(out.read_text())
    assert payload["tree"] == "ddtree:budget=6"
    rows = {r["method"]: r for r in payload["rows"]}
    assert rows["dflash"]["status"] == "ok" and rows["dflash"]["greedy_match"] is True
