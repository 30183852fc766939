"""The training loop: AdamW, warm-up + cosine schedule, clipping, JSONL logs, evaluation,
checkpoints in the official model format, exact resume.

Output directory layout::

    OUT/recipe.json                 the recipe actually used (model fields + TrainConfig)
    OUT/log.jsonl                   one JSON object per line (see below)
    OUT/checkpoint-0001000/         model.safetensors + config.json + tokenizer files (official
                                    format, loads with dllm.models.load) + trainer_state.pt
    OUT/best/                       the checkpoint with the best mean exact match over the
                                    C(Y|X) = 0 tasks, + best.json

Log lines: ``{"step", "loss", "lr", "grad_norm", "tokens_per_s", "steps_per_s", "seq_len"}`` every
``log_every`` steps (loss, grad norm and throughput averaged over those steps; grad norm before
clipping; tokens = real, non-pad tokens), ``{"step", "eval_mean_c0", "eval_mean", "eval": {task:
accuracy}, ...}`` after each evaluation, and ``{"event": "start" | "resume" | "checkpoint" |
"best" | "end", ...}`` markers.

Determinism: the batch of step s and its masking noise are pure functions of ``(seed, s)``
(``TaskMixture.batch`` and :func:`mask_generator`), and dropout does not exist, so the weights,
optimizer moments and scheduler position in ``trainer_state.pt`` (plus the float32 weights of the
checkpoint) are the whole state: a resumed run computes bit-identical losses. RNG states are saved
and restored as well, for anything else that draws from the global generators.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, Union

import torch

from dllm.tasks import TEST_SPLIT_SIZE
from dllm.train.data import Batch, TaskMixture
from dllm.scoring.exact_match import EvalResult, eval_examples, evaluate
from dllm.train.block_objective import training_loss
from dllm.options import check_int, check_number, check_unit
from dllm.train.recipes import Recipe, TrainConfig, build_model, count_parameters
from dllm.train.schedule import check_phases, lr_factor, phase_index, scheduled_lr_factor

STATE_FILE = "trainer_state.pt"
CHECKPOINT_PREFIX = "checkpoint-"


def mask_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator that draws the masking noise of training step ``step``."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) % (2**63 - 1))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices (linear weights, embedding, LM head); none on norms and biases."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


def checkpoints(out: Path) -> list[Path]:
    """Complete checkpoint directories under ``out``, oldest first."""
    found = [p for p in out.glob(f"{CHECKPOINT_PREFIX}*") if p.is_dir() and (p / STATE_FILE).is_file()
             and p.name[len(CHECKPOINT_PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX):]))


def _rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def check_intervals(cfg: TrainConfig) -> None:
    """Refuse a ``steps``, ``log_every`` or ``batch_size`` below 1, an ``eval_per_size`` outside [1,
    ``TEST_SPLIT_SIZE``] (the test instances training never draws), an ``eval_every``, ``save_every``,
    ``keep_last`` or ``warmup`` below 0 (0: never / at the end only / keep all / no warm-up), an ``lr``
    that is not > 0, a ``min_lr_ratio`` outside [0, 1], a ``mask_eps`` outside (0, 1) and a negative
    ``clip`` (0: no clipping), naming the field: ValueError (``SettingError``)."""
    for name, low in (("steps", 1), ("log_every", 1), ("batch_size", 1), ("eval_every", 0),
                      ("save_every", 0), ("keep_last", 0), ("warmup", 0)):
        check_int(name, getattr(cfg, name), low)
    # an evaluation scores test instances 0 .. eval_per_size - 1 of each size, and training redraws only the
    # split's TEST_SPLIT_SIZE (dllm.train.data.is_held_out): more would fail at the first evaluation
    check_int("eval_per_size", cfg.eval_per_size, 1, high=TEST_SPLIT_SIZE,
              hint=f" (test instances per size: the test split held out of training holds {TEST_SPLIT_SIZE})")
    check_number("lr", cfg.lr, low=0.0, low_open=True, finite=True)
    check_unit("min_lr_ratio", cfg.min_lr_ratio)
    check_unit("mask_eps", cfg.mask_eps, low_open=True, high_open=True)
    check_number("clip", cfg.clip, low=0.0)


def best_score(saved: Optional[float], best_dir: Path) -> Optional[float]:
    """The best score a resumed run must beat: the higher of the checkpoint's ``saved`` one and ``best_dir``'s
    ``best.json`` (written by an evaluation after that checkpoint, before the run stopped), so that ``best/``
    is only ever replaced by a better evaluation."""
    info = best_dir / "best.json"
    written = json.loads(info.read_text()).get("eval_mean_c0") if info.is_file() else None
    if not isinstance(written, (int, float)) or math.isnan(written):
        return saved
    return written if saved is None or written > saved else saved


class Trainer:
    """Train ``recipe`` into ``out``.

    >>> trainer = Trainer(get_recipe("tiny-llada"), "runs/tiny-llada", resume=True)
    >>> trainer.train()                  # until recipe.train.steps (or stop_at)
    """

    def __init__(self, recipe: Recipe, out: Union[str, Path], *, resume: bool = False,
                 progress: bool = True) -> None:
        cfg = recipe.train
        check_intervals(cfg)
        self.recipe, self.cfg = recipe, cfg
        self.out = Path(out)
        self.progress = progress
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.device = torch.device(cfg.device)
        self.model = build_model(recipe).to(self.device).train()
        self.loss_fn = training_loss(self.model)  # block diffusion for block-causal models
        self.optimizer = torch.optim.AdamW(param_groups(self.model, cfg.weight_decay), lr=cfg.lr,
                                           betas=cfg.betas, fused=False)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: scheduled_lr_factor(s, base_lr=cfg.lr, warmup=cfg.warmup, steps=cfg.steps,
                                          min_ratio=cfg.min_lr_ratio, phases=cfg.phases),
        )
        check_phases(cfg.phases, cfg.steps)
        # one mixture per phase (phase 0 = the recipe's own); batch = f(seed, step) in each
        self.mixtures = [TaskMixture(m, seed=cfg.seed, tokenizer=self.model.tokenizer)
                         for m in (cfg.mixture, *(p.mixture for p in cfg.phases))]
        self.step = 0  # completed optimiser steps
        self.best: Optional[float] = None  # best mean exact match over the C(Y|X) = 0 tasks
        self._eval_set = None
        self.resumed_from: Optional[Path] = None
        self.history: list[tuple[int, float]] = []  # (completed step, exact loss) of this session
        if resume:
            found = checkpoints(self.out)
            if found:
                self.load_checkpoint(found[-1])
        if cfg.compile:
            self.model.transformer.compile(dynamic=True)

    # ---- one step ----------------------------------------------------------------------------
    def train_step(self, batch: Batch, step: int) -> dict[str, float]:
        """Forward, backward, clip, AdamW and scheduler for global step ``step`` (0-based)."""
        cfg = self.cfg
        batch = batch.to(self.device)
        lr = self.optimizer.param_groups[0]["lr"]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
            out = self.loss_fn(self.model, batch.input_ids, batch.answer_mask, batch.key_padding_mask,
                                 batch.positions, mask_generator(cfg.seed, step), eps=cfg.mask_eps)
        out.loss.backward()
        max_norm = cfg.clip if cfg.clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": float(out.loss.detach()), "grad_norm": float(grad_norm), "lr": lr}

    # ---- the loop ----------------------------------------------------------------------------
    def train(self, stop_at: Optional[int] = None, time_limit: Optional[float] = None) -> dict[str, Any]:
        """Train until ``stop_at`` completed steps (default: the recipe's ``steps``; the schedule's
        horizon stays ``steps`` either way), or until ``time_limit`` seconds have passed since the
        call (then the step reached is checkpointed). Returns the last training log line."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        if time_limit is not None and not time_limit > 0:
            raise ValueError(f"time_limit must be > 0 seconds (or None), got {time_limit!r}")
        deadline = None if time_limit is None else time.perf_counter() + time_limit
        end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
        self.out.mkdir(parents=True, exist_ok=True)
        self._write_recipe()
        self.log({"event": "resume" if self.resumed_from else "start", "step": self.step,
                  "recipe": self.recipe.name, "params": count_parameters(self.model),
                  "threads": torch.get_num_threads(),
                  **({"from": str(self.resumed_from)} if self.resumed_from else {})})
        bar = tqdm(total=end, initial=self.step, disable=not self.progress, dynamic_ncols=True,
                   desc=self.recipe.name, file=sys.stderr)
        last: dict[str, Any] = {}
        out_of_time = False
        acc = {"loss": 0.0, "grad_norm": 0.0, "tokens": 0, "width": 0, "n": 0, "time": 0.0}
        while self.step < end:
            if deadline is not None and time.perf_counter() > deadline:
                out_of_time = True  # checkpoint the step reached (below) and stop
                break
            step = self.step
            t0 = time.perf_counter()  # training time only: evaluation and saving are not counted
            phase = phase_index(step, cfg.phases)
            batch = self.mixtures[phase].batch(step, self.batch_size(phase))
            stats = self.train_step(batch, step)
            acc["time"] += time.perf_counter() - t0
            self.step += 1
            self.history.append((self.step, stats["loss"]))
            acc["loss"] += stats["loss"]
            acc["grad_norm"] += stats["grad_norm"]
            acc["tokens"] += batch.n_tokens
            acc["width"] += batch.input_ids.shape[1]
            acc["n"] += 1
            bar.update(1)
            if self.step % cfg.log_every == 0 or self.step == end:
                dt = max(acc["time"], 1e-9)
                n = acc["n"]
                last = {"step": self.step, "loss": round(acc["loss"] / n, 5), "lr": stats["lr"],
                        "grad_norm": round(acc["grad_norm"] / n, 4),
                        "tokens_per_s": round(acc["tokens"] / dt, 1), "steps_per_s": round(n / dt, 3),
                        "seq_len": round(acc["width"] / n, 1)}
                self.log(last)
                bar.set_postfix(loss=f"{last['loss']:.4f}", lr=f"{stats['lr']:.2e}")
                acc = {"loss": 0.0, "grad_norm": 0.0, "tokens": 0, "width": 0, "n": 0, "time": 0.0}
            evaluated = cfg.eval_every > 0 and (self.step % cfg.eval_every == 0 or self.step == cfg.steps)
            if evaluated:
                self.run_eval()
            if (cfg.save_every > 0 and self.step % cfg.save_every == 0) or self.step == end:
                self.save_checkpoint()
        bar.close()
        if out_of_time and self.step > 0 and not (self.out / f"{CHECKPOINT_PREFIX}{self.step:07d}").exists():
            self.save_checkpoint()
        self.log({"event": "end", "step": self.step, "best_mean_c0": self.best})
        return last

    def batch_size(self, phase: int) -> int:
        """Examples per step in ``phase`` (0 = the recipe's own mixture)."""
        own = self.cfg.phases[phase - 1].batch_size if phase > 0 else None
        return own or self.cfg.batch_size

    # ---- evaluation --------------------------------------------------------------------------
    def run_eval(self) -> EvalResult:
        if self._eval_set is None:
            self._eval_set = eval_examples(self.cfg.mixture.task_names(), self.cfg.eval_per_size)
        result = evaluate(self.model, self._eval_set, autocast_bf16=self.cfg.bf16)
        self.log({"step": self.step, **result.to_log()})
        score = result.mean_c0
        if not math.isnan(score) and (self.best is None or score > self.best):
            self.best = score
            self._save_model_dir(self.out / "best", extra={"best.json": {
                "step": self.step, "eval_mean_c0": score, "eval_mean": result.mean,
                "eval": result.accuracy}})
            self.log({"event": "best", "step": self.step, "eval_mean_c0": round(score, 4)})
        return result

    # ---- checkpoints -------------------------------------------------------------------------
    def _save_model_dir(self, path: Path, state: Optional[dict[str, Any]] = None,
                        extra: Optional[dict[str, Any]] = None) -> None:
        """Write into ``path.tmp`` then rename, so a killed run never leaves a half checkpoint."""
        tmp = path.with_name(path.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        self.model.save_pretrained(tmp)  # official format + tokenizer files
        if state is not None:
            torch.save(state, tmp / STATE_FILE)
        for name, obj in (extra or {}).items():
            (tmp / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)

    def save_checkpoint(self) -> Path:
        path = self.out / f"{CHECKPOINT_PREFIX}{self.step:07d}"
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": _rng_states(),
            "best": self.best,
            "recipe": self.recipe.name,
            "train_config": asdict(self.cfg),
        }
        self._save_model_dir(path, state=state)
        for old in checkpoints(self.out)[:-self.cfg.keep_last] if self.cfg.keep_last > 0 else []:
            shutil.rmtree(old)
        self.log({"event": "checkpoint", "step": self.step, "path": str(path)})
        return path

    def load_checkpoint(self, path: Union[str, Path]) -> None:
        """Restore weights (from the official files), optimizer, scheduler, step, best (``best_score``) and RNG."""
        from dllm.models import load

        path = Path(path)
        loaded = load(path, dtype=torch.float32)
        with torch.no_grad():
            self.model.transformer.load_state_dict(loaded.transformer.state_dict())
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        # the optimizer saved the lr of the *saved* schedule; re-read it from this recipe's schedule
        # (equal when the recipe is unchanged; a longer horizon or a new phase applies at once)
        for group, base, fn in zip(self.optimizer.param_groups, self.scheduler.base_lrs,
                                   self.scheduler.lr_lambdas):
            group["lr"] = base * fn(self.scheduler.last_epoch)
        self.step = int(state["step"])
        self.best = best_score(state.get("best"), self.out / "best")
        _set_rng_states(state["rng"])
        self.resumed_from = path

    # ---- logging -----------------------------------------------------------------------------
    def log(self, record: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def _write_recipe(self) -> None:
        info = {"name": self.recipe.name, "family": self.recipe.family, "model": self.recipe.model,
                "init_from": self.recipe.init_from,
                "train": asdict(self.cfg)}
        (self.out / "recipe.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


__all__ = ["Trainer", "check_intervals", "checkpoints", "lr_factor", "mask_generator", "param_groups"]
