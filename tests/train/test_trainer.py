"""The training loop: schedule, learning on a fixed batch, exact resume, the saved checkpoint,
and the command line end to end (tiny models, one thread)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dllm.tasks import vocabulary
from dllm.models import load
from dllm.train import build_model, diffusion_loss
from dllm.train.__main__ import main
from dllm import tasks as T
from dllm.scoring.exact_match import c0_tasks
from dllm.train.recipes import C0_TASKS, get_recipe
from dllm.train.trainer import Trainer, checkpoints, lr_factor
from .helpers import small_batch, small_recipe


def test_lr_schedule_warmup_then_cosine():
    f = lambda s: lr_factor(s, warmup=10, total=110, min_ratio=0.1)  # noqa: E731
    assert all(math.isclose(f(s), (s + 1) / 10) for s in range(10))
    assert f(9) == 1.0 and f(10) == 1.0
    assert math.isclose(f(60), 0.55)  # half way down the cosine
    assert math.isclose(f(110), 0.1) and math.isclose(f(500), 0.1)


def test_loss_decreases_on_a_fixed_batch():
    torch.manual_seed(0)
    recipe = small_recipe("llada").with_overrides(dict(d_model=64, mlp_hidden=128))
    model = build_model(recipe, seed=0).train()
    batch = small_batch(batch_size=16)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(50):
        out = diffusion_loss(model, batch.input_ids, batch.answer_mask, batch.key_padding_mask,
                             batch.positions, torch.Generator().manual_seed(0))  # same masks each step
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(out.loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_resume_is_exact(tmp_path: Path, family: str):
    recipe = small_recipe(family, steps=20, save_every=2)
    straight = Trainer(recipe, tmp_path / "a", progress=False)
    straight.train(stop_at=4)
    first = Trainer(recipe, tmp_path / "b", progress=False)
    first.train(stop_at=2)
    resumed = Trainer(recipe, tmp_path / "b", resume=True, progress=False)
    assert resumed.step == 2 and resumed.resumed_from is not None
    resumed.train(stop_at=4)
    assert first.history == straight.history[:2]
    assert resumed.history == straight.history[2:]  # bit-identical losses after the resume
    for (k, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), k
    assert [p.name for p in checkpoints(tmp_path / "b")] == ["checkpoint-0000002", "checkpoint-0000004"]
    events = [json.loads(line) for line in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert [e.get("event") for e in events if "event" in e][:2] == ["start", "checkpoint"]
    assert any(e.get("event") == "resume" and e["step"] == 2 for e in events)


def test_a_time_limit_stops_and_checkpoints_the_step_reached(tmp_path: Path, monkeypatch):
    import dllm.train.trainer as trainer_module

    clock = iter(range(1000))  # every perf_counter call advances one "second"
    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: float(next(clock)))
    trainer = Trainer(small_recipe("llada", steps=50, save_every=100), tmp_path, progress=False)
    trainer.train(time_limit=7.5)
    assert 0 < trainer.step < 50
    assert [p.name for p in checkpoints(tmp_path)] == [f"checkpoint-{trainer.step:07d}"]
    with pytest.raises(ValueError, match="time_limit must be > 0"):
        trainer.train(time_limit=0)


def test_checkpoint_loads_in_official_format(tmp_path: Path):
    trainer = Trainer(small_recipe("dream", steps=2), tmp_path, progress=False)
    trainer.train()
    ckpt = checkpoints(tmp_path)[-1]
    assert (ckpt / "trainer_state.pt").is_file() and (ckpt / "model.safetensors").is_file()
    config = json.loads((ckpt / "config.json").read_text())
    assert config["model_type"] == "Dream" and config["mask_token_id"] == 1
    model = load(ckpt)
    assert model.family == "dream" and model.dtype == torch.float32
    assert (model.mask_id, model.eos_id, model.pad_id, model.bos_id) == (1, 4, 0, 2)
    vocab = model.tokenizer.get_vocab()
    assert all(vocab[w] == i for i, w in enumerate(vocabulary()[:80])) and len(vocab) == 80
    batch = small_batch()
    trainer.model.eval()
    with torch.no_grad():
        a = trainer.model(batch.input_ids, positions=batch.positions, key_padding_mask=batch.key_padding_mask)
        b = model(batch.input_ids, positions=batch.positions, key_padding_mask=batch.key_padding_mask)
    assert torch.equal(a.logits, b.logits)


def test_c0_tasks_from_total_correlation():
    assert set(c0_tasks()) == {
        "copy", "reverse", "sort", "sort_num", "replace_index", "insert_index", "remove_index",
        "copy_2tok", "reverse_2tok", "sort_2tok", "replace_index_2tok", "insert_index_2tok",
        "remove_index_2tok", "sudoku4", "add_lsb", "add_msb", "cumsum",
    }
    assert tuple(c0_tasks()) == C0_TASKS  # the recipes' up-weighted tasks
    # other suites on request; an evaluation marks the C = 0 tasks of whatever suites it covers
    from dllm.scoring.exact_match import c0_of

    assert set(c0_tasks(suite="long-prompt")) == {"count_long", "lookup_long", "span_copy_far"}
    assert set(c0_of(["lookup_any", "lookup_long", "copy", "pick_pair"])) == {"lookup_long", "copy"}
    assert c0_of([]) == ()


def test_recipes_upweight_the_c0_tasks():
    for name in ("tiny-llada", "tiny-dream"):
        mix = get_recipe(name).train.mixture
        weights = dict(zip(mix.task_names(), mix.task_weights()))
        assert set(weights) == set(T.suite_task_names())
        for task, w in weights.items():
            assert w == pytest.approx(weights["copy"] if task in C0_TASKS else weights["copy"] / 2)


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-dream"])
def test_recipe_init_embedding_at_unit_scale_linears_at_002(name):
    """The recipes' init (see ``init_for_training``): embedding N(0, 1), linears N(0, 0.02^2),
    residual projections scaled down, norms 1; a tied embedding (also the output head) keeps 0.02."""
    model = build_model(get_recipe(name), seed=0)
    params = dict(model.transformer.named_parameters())
    assert params["embed.weight"].std().item() == pytest.approx(1.0, rel=0.05)
    assert params["layers.0.attn.q_proj.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    assert params["layers.0.attn.o_proj.weight"].std().item() == pytest.approx(0.02 / 12 ** 0.5, rel=0.05)
    assert params["lm_head.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    assert bool((params["norm.weight"] == 1).all())
    tied = build_model(get_recipe(name).with_overrides(dict(tie_embeddings=True)), seed=0)
    assert tied.transformer.lm_head is None
    assert tied.transformer.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_cli_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "tmp"
    rc = main(["--recipe", "tiny-llada", "--steps", "3", "--eval-every", "2", "--out", str(out),
               "--tiny", "--log-every", "1", "--no-progress", "--threads", "1"])
    assert rc == 0
    exported, out = out / "export" / "tiny-llada", out / "tiny-llada"  # the chain's one stage
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["step"] == 3 and summary["best_mean_c0"] is not None
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    train = [r for r in lines if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all({"lr", "grad_norm", "tokens_per_s"} <= set(r) for r in train)
    evals = [r for r in lines if "eval" in r]
    assert [r["step"] for r in evals] == [2, 3] and len(evals[0]["eval"]) == 31
    assert (out / "best" / "best.json").is_file() and (out / "recipe.json").is_file()
    assert load(checkpoints(out)[-1]).family == "llada"
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["model"]["d_model"] == 32 and recipe["train"]["steps"] == 3
    assert load(exported).config.d_model == 32  # the stage's best, exported
    assert json.loads((exported / "training.json").read_text())["source"] == str(out / "best")


@pytest.mark.slow
def test_module_entry_point(tmp_path: Path):
    """The literal command line, in a subprocess (Dream, tiny overrides)."""
    out = tmp_path / "tmp"
    cmd = [sys.executable, "-m", "dllm.train", "--recipe", "tiny-dream", "--steps", "3", "--eval-every",
           "2", "--out", str(out), "--tiny", "--threads", "1", "--no-progress"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["step"] == 3
    assert load(checkpoints(out / "tiny-dream")[-1]).family == "dream"
