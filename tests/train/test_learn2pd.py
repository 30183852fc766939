"""The Learn2PD filter's recipe (``dllm/train/learn2pd.py``): the Extremely Greedy Parallel labels,
a small run end to end (deterministic, it learns, the sampler reads its output, export copies it),
the command line; and, slow, the shipped filter's data and first step reproduced."""

from __future__ import annotations

import json

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.samplers.learn2pd import load_filter
from dllm.train.learn2pd import (FilterRecipe, collect, egp_traces, filter_recipes, fit, split, train_filter,
                                 training_examples)


def _prompts(model, task: str, size: int, n: int) -> list[list[int]]:
    return [model.generation_prompt(" ".join(T.prompt_words(ex))) for ex in T.test_split(task, size, n=n)]


@pytest.mark.parametrize("block", [5, 2])
def test_the_oracle_labels_its_own_steps_and_ends_on_the_reference(block):
    """Each record labels 1 exactly where the step's arg-max equals the one-token-per-step answer;
    the oracle's decode is that answer (it commits nothing else; a stuck block gets it written)."""
    model = dllm.load("tiny-llada")
    prompts = _prompts(model, "shuffle", 4, 6)  # equal lengths; several answers: parallel steps disagree
    ref = dllm.generate(model, prompts, sampler="low_confidence", gen_length=5, block_length=block).generated
    traces, decoded = egp_traces(model, prompts, ref, block, width=8)
    assert torch.equal(decoded, ref)
    assert len(traces) >= len(prompts) * -(-5 // block)  # at least one step per row and block
    widths = traces.valid.sum(dim=1)  # a block's positions (the last block of 5 may be narrower), then padding
    assert set(widths.tolist()) <= {block, 5 % block or block}
    assert torch.equal(traces.valid, torch.arange(8)[None, :] < widths[:, None])
    assert ((traces.label == 0) | (traces.label == 1)).all() and (traces.conf[~traces.valid] == 0).all()


def test_training_prompts_leave_the_test_split_out():
    exs = training_examples("copy", 12, seed=0)
    assert len(exs) == 12 and not any(T.is_test_prompt(ex) for ex in exs)
    assert {ex.size for ex in exs} == set(T.get_task("copy").default_sizes)
    assert [ex.prompt for ex in exs] == [ex.prompt for ex in training_examples("copy", 12, seed=0)]


SMALL = FilterRecipe("small", models=("tiny-llada",), tasks=("copy", "shuffle"), prompts_per_task=4, width=16,
                     hidden=8, epochs=40, log_every=10, input="surprisal")


def test_a_small_run_is_deterministic_learns_and_exports(tmp_path):
    from dllm.train.export import export

    a = train_filter(SMALL, tmp_path / "a", threads=1, log=lambda line: None)
    train_filter(SMALL, tmp_path / "b", threads=1, log=lambda line: None)
    fa, fb = load_filter(tmp_path / "a" / "final"), load_filter(tmp_path / "b" / "final")
    assert all(torch.equal(x, y) for x, y in zip(fa.state_dict().values(), fb.state_dict().values()))
    history = [json.loads(line) for line in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert history[-1]["loss"] < history[0]["loss"]
    assert fa.input == "surprisal" and fa.meta["recipe"]["name"] == "small" and a["records"] >= 8
    out = dllm.generate(dllm.load("tiny-llada"), _prompts(dllm.load("tiny-llada"), "copy", 4, 2),
                        sampler="learn2pd", filter=str(tmp_path / "a" / "final"), gen_length=5)
    assert (out.generated != 1).all()
    shipped = export(tmp_path / "a", "learn2pd-test", root=tmp_path / "embedded", note="from a test")
    assert json.loads((shipped / "filter.json").read_text())["note"] == "from a test"
    assert load_filter(shipped).state_dict().keys() == fa.state_dict().keys()
    with pytest.raises(ValueError, match=r"--checkpoint nope: .* is a Learn2PD filter run"):  # not silently final/
        export(tmp_path / "a", "learn2pd-test", "nope", root=tmp_path / "embedded")


def test_the_command_line_lists_and_plans_the_recipes(capsys):
    from dllm.train.__main__ import main

    assert main(["--list-recipes"]) == 0
    listed = capsys.readouterr().out
    assert "learn2pd-tiny " in listed and "learn2pd-tiny-surprisal" in listed
    assert main(["--recipe", "learn2pd-tiny", "--dry-run", "--steps", "7"]) == 0
    plan = json.loads(capsys.readouterr().out.splitlines()[1])
    assert plan["epochs"] == 7 and plan["input"] == "confidence" and plan["models"] == ["tiny-llada", "tiny-dream"]


def test_bad_recipe_fields_are_refused():
    with pytest.raises(ValueError, match="input must be one of"):
        FilterRecipe("x", input="logits")
    with pytest.raises(ValueError, match="prompts_per_task must be an integer >= 1"):
        FilterRecipe("x", prompts_per_task=0)


SHIPPED = ("learn2pd-tiny", "learn2pd-tiny-surprisal")
TRACED = ("models", "tasks", "prompts_per_task", "block_lengths", "width", "seed")  # what collect and split read


@pytest.mark.slow
def test_the_shipped_filters_are_reproduced():
    """Each recipe's data (every record) and its first training step give its shipped filter's counts
    and logged loss (one thread, as the shipped filters were made). The recipes differ only in what the
    filter reads, so one collection serves both (checked first)."""
    from dllm.samplers.learn2pd import filter_directory

    torch.set_num_threads(1)
    recipes = [filter_recipes.get(name) for name in SHIPPED]
    traced = [{k: getattr(r, k) for k in TRACED} for r in recipes]
    assert traced[0] == traced[1], "the shipped recipes collect different traces: collect each"
    train, val, test = split(collect(recipes[0], log=lambda line: None), recipes[0].seed)
    for recipe in recipes:
        made = json.loads((filter_directory(recipe.name) / "filter.json").read_text())
        assert {"train": len(train), "validation": len(val), "test": len(test)} == made["records"], recipe.name
        first = fit(recipe.with_overrides(epochs=1), train, val, log=lambda line: None)[1][0]
        assert first["loss"] == pytest.approx(made["first"]["loss"], abs=1e-6), recipe.name
        assert first["val_loss"] == pytest.approx(made["first"]["val_loss"], abs=1e-6), recipe.name


def _records(n: int, width: int = 16):
    from dllm.train.learn2pd import Traces

    gen = torch.Generator().manual_seed(0)
    valid = torch.arange(width)[None, :] < 5  # [1, W]: a block of 5
    conf = torch.rand(n, width, generator=gen) * valid
    return Traces(conf, (conf > 0.5).float(), valid.expand(n, width).clone())


def _no_nan(text: str):
    def refuse(constant: str):
        raise AssertionError(f"filter.json holds {constant}: not valid JSON")

    return json.loads(text, parse_constant=refuse)


def test_an_empty_split_is_written_as_null_not_nan(tmp_path, monkeypatch):
    """5 records split 4 / 0 / 1: the empty validation split's numbers are null in filter.json (NaN
    before: invalid JSON); a fit whose training split would be empty is refused by name."""
    import dllm.train.learn2pd as l2p

    monkeypatch.setattr(l2p, "collect", lambda recipe, log=print, progress=False: _records(5))
    recipe = SMALL.with_overrides(epochs=2)
    train_filter(recipe, tmp_path / "a", threads=1, log=lambda line: None)
    made = _no_nan((tmp_path / "a" / "final" / "filter.json").read_text())
    assert made["records"] == {"train": 4, "validation": 0, "test": 1}
    assert made["evaluation"]["validation"] == {"loss": None, "positions": 0, "final_share": None,
                                                **{f"at_{t}": {"accuracy": None, "precision": None,
                                                               "accepted": None} for t in (0.9, 0.96)}}
    assert made["evaluation"]["test"]["positions"] == 5 and made["evaluation"]["test"]["loss"] is not None
    monkeypatch.setattr(l2p, "collect", lambda recipe, log=print, progress=False: _records(1))
    with pytest.raises(ValueError, match="1 records leave the training split .* empty; raise prompts_per_task"):
        train_filter(recipe, tmp_path / "b", threads=1, log=lambda line: None)
    assert not (tmp_path / "b" / "final").exists()


def test_progress_bars_follow_the_flag(tmp_path, monkeypatch, capsys):
    """``progress=True`` (``dllm train --recipe learn2pd-tiny`` without ``--no-progress``) shows tqdm bars
    over the collection's tasks and the fit's epochs on stderr; ``progress=False`` shows none (the
    filter recipes had no bar at all, whatever the flag said)."""
    import dllm.train.learn2pd as l2p

    recipe = SMALL.with_overrides(tasks=("copy",), prompts_per_task=2, epochs=3)
    l2p.collect(recipe, log=lambda line: None, progress=True)
    assert "tiny-llada traces" in capsys.readouterr().err
    l2p.collect(recipe, log=lambda line: None, progress=False)
    assert "traces" not in capsys.readouterr().err
    monkeypatch.setattr(l2p, "collect", lambda recipe, log=print, progress=False: _records(20))
    train_filter(recipe, tmp_path / "a", threads=1, log=lambda line: None, progress=True)
    assert "small fit" in capsys.readouterr().err
    train_filter(recipe, tmp_path / "b", threads=1, log=lambda line: None, progress=False)
    assert "fit" not in capsys.readouterr().err
