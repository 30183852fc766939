"""Training phases (dllm/train/schedule.py): the restarted schedule, validation, and the property the
shipped models rely on: a run resumed at a phase start from the shorter recipe's checkpoint is
bit-identical to the phased recipe from scratch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dllm.train import MixtureConfig
from dllm.train.recipes import FOCUS_TASKS, PHASE1_STEPS, get_recipe
from dllm.train.schedule import Phase, check_phases, lr_factor, phase_index, scheduled_lr_factor
from dllm.train.trainer import Trainer, checkpoints
from .helpers import small_recipe

COPY_ONLY = MixtureConfig(tasks=("copy",))


def test_phase_zero_is_the_unphased_schedule_up_to_the_phase_start():
    phases = (Phase(100, COPY_ONLY, lr=5e-4, warmup=10),)
    f = lambda s: scheduled_lr_factor(s, base_lr=1e-3, warmup=20, steps=300, min_ratio=0.1,  # noqa: E731
                                      phases=phases)
    for s in range(100):
        assert f(s) == lr_factor(s, warmup=20, total=100, min_ratio=0.1)
    assert 0.1 < f(99) < 0.101  # phase 0 decays to 0.1 at its end (step 100)
    assert math.isclose(f(100), 0.5 * 1 / 10)  # restart: warm-up step 1 of 10 to 5e-4
    assert math.isclose(f(109), 0.5) and math.isclose(f(110), 0.5)  # the phase's peak
    assert math.isclose(f(299), 0.05, rel_tol=1e-3) and math.isclose(f(300), 0.05)  # 0.1 * 5e-4


def test_phase_index_and_validation():
    a, b = Phase(10, COPY_ONLY, lr=1e-3), Phase(20, COPY_ONLY, lr=1e-3)
    assert [phase_index(s, (a, b)) for s in (0, 9, 10, 19, 20, 99)] == [0, 0, 1, 1, 2, 2]
    check_phases((a, b), steps=21)
    with pytest.raises(ValueError, match="strictly increasing"):
        check_phases((b, a), steps=100)
    with pytest.raises(ValueError, match="strictly increasing"):
        check_phases((a, a), steps=100)
    with pytest.raises(ValueError, match="phase start 20 is not below steps=20"):
        check_phases((a, b), steps=20)
    with pytest.raises(ValueError, match="Phase.start"):
        Phase(0, COPY_ONLY, lr=1e-3)
    with pytest.raises(ValueError, match="Phase.lr"):
        Phase(5, COPY_ONLY, lr=0.0)
    with pytest.raises(ValueError, match="Phase.warmup"):
        Phase(5, COPY_ONLY, lr=1e-3, warmup=-1)
    with pytest.raises(ValueError, match="not below steps"):
        Trainer(small_recipe("llada", steps=5, phases=(Phase(5, COPY_ONLY, lr=1e-3),)), "unused",
                progress=False)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_resume_at_a_phase_start_equals_the_phased_run(tmp_path: Path, family: str):
    phase = Phase(3, COPY_ONLY, lr=5e-3, warmup=2)
    phased = small_recipe(family, steps=6, phases=(phase,))
    straight = Trainer(phased, tmp_path / "a", progress=False)
    straight.train()
    # the shorter recipe (phase 0 only, horizon 3), then the phased recipe resumed from its checkpoint
    short = Trainer(small_recipe(family, steps=3), tmp_path / "b", progress=False)
    short.train()
    assert [p.name for p in checkpoints(tmp_path / "b")] == ["checkpoint-0000003"]
    resumed = Trainer(phased, tmp_path / "b", resume=True, progress=False)
    resumed.train()
    assert short.history + resumed.history == straight.history  # bit-identical losses
    for (k, x), y in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(x, y), k
    lines = [json.loads(s) for s in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    lr = {e["step"]: e["lr"] for e in lines if "lr" in e}  # lr used by step s - 1
    assert lr[4] == pytest.approx(5e-3 / 2) and lr[5] == pytest.approx(5e-3)
    # the phase draws its own mixture: copy only from step 3 on, the recipe's tasks before
    assert straight.mixtures[1].config.task_names() == ("copy",)
    assert not torch.equal(straight.mixtures[0].batch(3, 8).input_ids, straight.mixtures[1].batch(3, 8).input_ids)


def test_shipped_recipes_focus_phase():
    for name in ("tiny-llada", "tiny-dream"):
        cfg = get_recipe(name).train
        phase = cfg.phases[0]
        assert phase.start == PHASE1_STEPS < cfg.steps
        base = dict(zip(cfg.mixture.task_names(), cfg.mixture.weights))
        focus = dict(zip(phase.mixture.task_names(), phase.mixture.weights))
        assert set(focus) == set(base)
        for task, w in focus.items():  # only the focus tasks change weight
            assert w == (10.0 if task in FOCUS_TASKS else base[task])


def test_dream_sort_num_phase_keeps_the_focus_schedule_before_it():
    """tiny-dream's third phase was added while phase 2 ran: phase 2's lr up to the new start is
    the two-phase recipe's (tiny-llada's), so the resumed run is the recipe's run."""
    llada, dream = get_recipe("tiny-llada").train, get_recipe("tiny-dream").train
    assert len(dream.phases) == 2 and dream.phases[0].horizon == llada.steps
    third = dream.phases[1]
    weights = dict(zip(third.mixture.task_names(), third.mixture.task_weights()))
    assert max(weights, key=weights.get) == "sort_num"

    def lr(cfg, s):
        return scheduled_lr_factor(s, base_lr=cfg.lr, warmup=cfg.warmup, steps=cfg.steps,
                                   min_ratio=cfg.min_lr_ratio, phases=cfg.phases)

    assert all(lr(dream, s) == lr(llada, s) for s in range(0, third.start, 7))
    assert lr(dream, third.start) != lr(llada, third.start)


def test_horizon_cuts_nothing_before_a_later_phase():
    a = Phase(10, COPY_ONLY, lr=1e-3, warmup=2, horizon=100)
    b = Phase(40, COPY_ONLY, lr=1e-3, warmup=2)
    f = lambda s, ph: scheduled_lr_factor(s, base_lr=1e-3, warmup=2, steps=120, min_ratio=0.1,  # noqa: E731
                                          phases=ph)
    alone = (Phase(10, COPY_ONLY, lr=1e-3, warmup=2),)  # ends at steps=120 ...
    assert f(50, alone) != f(50, (a,))  # ... while a's cosine ends at its horizon 100
    assert [f(s, (a, b)) for s in range(40)] == [f(s, (a,)) for s in range(40)]
    assert math.isclose(f(99, (a,)), 0.1, rel_tol=1e-2) and f(110, (a,)) == 0.1
    with pytest.raises(ValueError, match="Phase.horizon must be an int > start=10"):
        Phase(10, COPY_ONLY, lr=1e-3, horizon=10)


def test_cli_steps_below_a_phase_start_drops_the_phase(tmp_path: Path):
    from dllm.train.__main__ import main

    assert main(["--recipe", "tiny-llada", "--tiny", "--steps", "2", "--out", str(tmp_path),
                 "--eval-every", "0", "--no-progress"]) == 0
    recipe = json.loads((tmp_path / "tiny-llada" / "recipe.json").read_text())
    assert recipe["train"]["steps"] == 2 and recipe["train"]["phases"] == []
