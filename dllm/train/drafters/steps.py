"""What every drafter recipe's run shares (``dflash_train``, ``jetspec_train``, ``dspark_train``): the
target-regenerated data, the optimiser loop with its log, and the ``training.json`` record.

A recipe brings its drafter and its loss: ``train_steps`` calls ``step_loss(step, ids, lengths,
prompt_lengths, gen)`` on each batch (``gen``: the run's one generator, seeded by the recipe, which
also shuffled the pool) and takes (loss, accepted [...] bool) back.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TextIO, Union

import torch

from dllm import tasks as T
from dllm.options import check_int, check_number
from dllm.tasks.vocab import PAD, word_id
from dllm.train.ar import greedy_answers, hf_tokenizer
from dllm.train.data import TaskMixture
from dllm.train.schedule import lr_factor

# (step, ids [B, L], lengths [B], prompt lengths [B], generator) -> (loss, accepted drafts [...] bool)
StepLoss = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator],
                    tuple[torch.Tensor, torch.Tensor]]


def regenerate(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """prompt + the target's greedy answer (up to its first EOS) per prompt."""
    answers = greedy_answers(target, prompts, max_new_tokens)
    return [list(p) + a for p, a in zip(prompts, answers)]


def pad_rows(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L] and lengths [B]."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), word_id(PAD), dtype=torch.long)
    for j, r in enumerate(rows):
        ids[j, :len(r)] = torch.tensor(r)
    return ids, torch.tensor([len(r) for r in rows])


@dataclass(frozen=True)
class DraftData:
    """Prompts and the target's own greedy rows (prompt + answer): the training pool and the held-out set."""

    prompts: list[list[int]]
    rows: list[list[int]]
    held_prompts: list[list[int]]
    held_rows: list[list[int]]

    @property
    def held_lens(self) -> list[int]:
        return [len(p) for p in self.held_prompts]


def start_run(recipe: Any, out: Union[str, Path], *, threads: int, target: Any,
              seed: bool = True) -> tuple[Path, Any]:
    """A drafter run's start: ``threads`` > 0 sets torch's CPU threads, ``seed`` seeds torch from
    ``recipe.seed``, ``out`` is made; returns it and the target (``recipe.target`` loaded when
    ``target`` is None) in float32, in eval mode and frozen."""
    from dllm.models.targets import load_target

    if threads > 0:
        torch.set_num_threads(threads)
    if seed:
        torch.manual_seed(recipe.seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if target is None:
        target, _ = load_target(recipe.target)
    return out, target.float().eval().requires_grad_(False)


def draft_data(target: Any, recipe: Any) -> DraftData:
    """``recipe.pool`` prompts of ``recipe.mixture`` (seeded by ``recipe.seed``) and
    ``recipe.eval_examples`` held-out ones per task size, answered by the target (``regenerate``)."""
    vocab = hf_tokenizer().get_vocab()
    mix = TaskMixture(recipe.mixture, seed=recipe.seed, tokenizer=hf_tokenizer())
    rng = mix.rng(-1)
    examples = [mix.sample(rng) for _ in range(recipe.pool)]
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples]
    longest = max(T.answer_length(ex.task, ex.size) for ex in examples)
    rows = regenerate(target, prompts, longest)
    held = [ex for n in recipe.mixture.task_names() for ex in T.test_split(n, None, n=recipe.eval_examples)]
    held_prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in held]
    held_longest = max(T.answer_length(ex.task, ex.size) for ex in held)  # the test split's sizes, not the pool's
    return DraftData(prompts, rows, held_prompts, regenerate(target, held_prompts, held_longest))


def check_stop(stop_at: Optional[int], time_limit: Optional[float]) -> None:
    """Refuse a ``stop_at`` that is not an integer >= 1 or a ``time_limit`` that is not > 0 seconds (None: no limit)."""
    if stop_at is not None:
        check_int("stop_at", stop_at, 1, hint=" (stop after this many steps)")
    if time_limit is not None:
        check_number("time_limit", time_limit, low=0.0, low_open=True, hint=" (seconds of training steps)")


def train_steps(recipe: Any, params: list[torch.nn.Parameter], step_loss: StepLoss, data: DraftData, log: TextIO,
                t0: float, *, weight_decay: float, progress: bool = True, stop_at: Optional[int] = None,
                time_limit: Optional[float] = None) -> int:
    """``recipe.steps`` AdamW steps (warm-up then cosine to ``min_lr_ratio``, gradients clipped at
    ``recipe.clip``) over batches of ``recipe.batch_size`` rows taken in one seeded shuffled order;
    every ``recipe.log_every`` steps, and after the last step, the mean loss and training tau go to
    ``log`` (JSON lines).

    ``stop_at`` stops after that many steps (smoke runs), ``time_limit`` after the first step that
    ends more than that many seconds after the loop began; the schedule's horizon stays
    ``recipe.steps`` either way. Returns the number of steps taken."""
    from tqdm.auto import tqdm

    check_stop(stop_at, time_limit)
    end = recipe.steps if stop_at is None else min(stop_at, recipe.steps)
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(
        s, warmup=recipe.warmup, total=recipe.steps, min_ratio=recipe.min_lr_ratio))
    gen = torch.Generator().manual_seed(recipe.seed)
    order = torch.randperm(len(data.rows), generator=gen).tolist()
    losses: list[float] = []
    accepted: list[float] = []
    done = 0
    for step in tqdm(range(end), disable=not progress, desc=recipe.name):
        start = (step * recipe.batch_size) % len(order)
        pick = [order[(start + i) % len(order)] for i in range(recipe.batch_size)]
        ids, lengths = pad_rows([data.rows[i] for i in pick])
        prompt_lens = torch.tensor([len(data.prompts[i]) for i in pick])
        loss, acc = step_loss(step, ids, lengths, prompt_lens, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, recipe.clip)
        used = sched.get_last_lr()[0]  # this step's rate (after sched.step() it is the next step's)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        accepted.append(float(acc.float().mean()))
        done = step + 1
        out_of_time = deadline is not None and time.perf_counter() > deadline
        if done % recipe.log_every == 0 or done == end or out_of_time:  # the last steps' line too
            log.write(json.dumps({"step": done, "loss": sum(losses) / len(losses),
                                  "train_tau": 1 + sum(accepted) / len(accepted), "lr": used,
                                  "elapsed_s": round(time.perf_counter() - t0, 1)}) + "\n")
            log.flush()
            losses.clear()
            accepted.clear()
        if out_of_time:
            break
    return done


def write_record(final: Path, recipe: Any, result: dict[str, Any], t0: float) -> None:
    """``final/training.json``: the recipe, its evaluation and the run's seconds."""
    (final / "training.json").write_text(json.dumps({"recipe": asdict(recipe), "evaluation": result,
                                                     "train_seconds": round(time.perf_counter() - t0, 1)},
                                                    indent=2, sort_keys=True, default=str) + "\n")


__all__ = ["DraftData", "StepLoss", "check_stop", "draft_data", "pad_rows", "regenerate", "start_run", "train_steps",
           "write_record"]
