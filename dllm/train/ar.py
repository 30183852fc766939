"""Autoregressive targets for speculative decoding: ``python -m dllm.train --recipe tiny-ar``.

The target of a diffusion drafter is an ordinary causal LM, so these recipes train transformers'
own ``Qwen3ForCausalLM`` (saved with ``save_pretrained``: ``config.json`` +
``model.safetensors`` + ``generation_config.json``, plus the task tokenizer as
``tokenizer.json``), loadable offline with ``AutoModelForCausalLM.from_pretrained``.

Data: the stress-task mixture of ``dllm.train.data`` (``TaskMixture``: right-padded rows
``[BOS] task args [SEP] answer [EOS]``, test-split prompts held out): ``AR_MIXTURE``, the
long-answer suite plus the short copy / reverse tasks.
Objective: next-token cross-entropy on the answer tokens and the first EOS (SFT: the prompt is
given, not learned; the EOS padding after the first EOS is dropped, an AR model stops there).

Recipes (``AR_RECIPES``):
- ``tiny-ar``: the target, Qwen3 d 128, 4 layers, 4 query / 2 KV heads of 32, SwiGLU 384.
- ``tiny-ar-mini``: the target's shape on the PB-mini suite, the tasks of the tiny diffusion models:
  the verifier of their ``apd`` sampler.
- ``tiny-ar-draft``: a 2-layer model of the target's width (the fewest layers that learn to copy)
  for transformers' assisted generation
  (``assistant_model=``), trained the same way: the small AR draft model the diffusion drafter is
  compared against.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from dllm import tasks as T
from dllm.models.text.task_tokenizer import task_tokenizer
from dllm.models.text.tokenizer import save_tokenizer
from dllm.options import Overridable, check_int
from dllm.registry import Registry
from dllm.tasks.vocab import BOS, EOS, PAD, word_id
from dllm.train.data import Batch, MixtureConfig, TaskMixture
from dllm.train.schedule import lr_factor

LONG_MIXTURE = MixtureConfig(tasks=T.suite_task_names(T.SUITES[1]))
# the AR recipes: the long-answer suite and the short PB-mini copy / reverse
# tasks (distinct items: the next item follows the current one in the prompt, which teaches the
# copying heads early; the long lists repeat letters and need more context to find their place)
SHORT_COPY_TASKS = ("copy", "reverse", "copy_2tok", "reverse_2tok")
AR_MIXTURE = MixtureConfig(tasks=LONG_MIXTURE.tasks + SHORT_COPY_TASKS)  # uniform: 3/7 long rows


@dataclass(frozen=True)
class ARPhase:
    """A later phase: ``steps`` more steps on ``mixture``, a fresh optimiser, warm-up to ``lr``, cosine."""

    steps: int
    lr: float
    mixture: MixtureConfig
    warmup: int = 50


@dataclass(frozen=True)
class ARRecipe(Overridable):
    """A Qwen3 causal LM over the task vocabulary and how to train it."""

    name: str
    model: dict[str, Any]  # transformers.Qwen3Config fields
    steps: int = 6000
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    embed_std: float = 1.0  # init std of the input embedding (the rest: Qwen3's N(0, 0.02))
    log_every: int = 25
    eval_every: int = 1000
    eval_per_size: int = 8
    mixture: MixtureConfig = field(default_factory=lambda: AR_MIXTURE)
    phases: tuple[ARPhase, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        # the evaluation scores test instances 0 .. eval_per_size - 1 of each size; training redraws only the
        # split's TEST_SPLIT_SIZE (dllm.train.data.is_held_out), so more would be scored on trainable prompts
        check_int("eval_per_size", self.eval_per_size, 1, high=T.TEST_SPLIT_SIZE,
                  hint=f" (test instances per size: the test split held out of training holds {T.TEST_SPLIT_SIZE})")


_QWEN3 = dict(vocab_size=88, hidden_size=128, intermediate_size=384, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=512, rope_theta=10000.0,
              rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.02)

ar_recipes: Registry[ARRecipe] = Registry("recipe")
ar_recipes.add("tiny-ar", ARRecipe("tiny-ar", dict(_QWEN3, num_hidden_layers=4),
                                   phases=(ARPhase(4000, 5e-4, LONG_MIXTURE),),
                                   description="Qwen3-format 0.8M AR target on the long-answer suite"),
               description="Qwen3-format AR target (4 layers) on the long-answer suite")
ar_recipes.add("tiny-ar-mini", ARRecipe(
    "tiny-ar-mini", dict(_QWEN3, num_hidden_layers=4), steps=15000,
    mixture=MixtureConfig(tasks=tuple(T.suite_task_names())),
    description="Qwen3-format AR model (4 layers) on the PB-mini suite: APD's verifier for the tiny models"),
    description="Qwen3-format AR model (4 layers) on the PB-mini suite (APD's verifier)")
ar_recipes.add("tiny-ar-draft", ARRecipe(
    "tiny-ar-draft", dict(_QWEN3, num_hidden_layers=2), steps=4000,
    description="2-layer Qwen3 AR draft model for assisted generation"),
    description="2-layer Qwen3 AR draft model (assisted generation baseline)")


def hf_tokenizer():
    """The task tokenizer as a transformers tokenizer (all words, long-answer tokens included)."""
    return task_tokenizer()


def build_ar_model(recipe: ARRecipe):
    """A freshly initialised float32 ``Qwen3ForCausalLM`` with the task vocabulary's special ids."""
    from dllm.lazy import preimport_quietly, quiet_import_chatter

    preimport_quietly("torchao")  # transformers imports it with the model classes: its chatter kept quiet
    with quiet_import_chatter():
        from transformers import Qwen3Config, Qwen3ForCausalLM

    if recipe.model["vocab_size"] < len(T.vocabulary()):
        raise ValueError(f"recipe {recipe.name!r}: vocab_size {recipe.model['vocab_size']} < the task "
                         f"vocabulary's {len(T.vocabulary())} words")
    config = Qwen3Config(**recipe.model, bos_token_id=word_id(BOS), eos_token_id=word_id(EOS),
                         pad_token_id=word_id(PAD))
    torch.manual_seed(recipe.seed)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():  # a unit-scale input embedding (torch's nn.Embedding default), not 0.02:
        # at d 128 a 0.02 embedding drowns in the residual stream and copying never starts
        # (the lesson of the diffusion recipes, ``dllm.train.recipes.init_for_training``)
        model.model.embed_tokens.weight.normal_(0.0, recipe.embed_std)
    model.generation_config.pad_token_id = word_id(PAD)
    model.generation_config.eos_token_id = word_id(EOS)
    model.generation_config.bos_token_id = word_id(BOS)
    return model.float()


def answer_targets(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels [B, L-1], weight [B, L-1]): position t predicts token t+1, counted when that token is
    in the answer up to and including the first EOS."""
    eos = word_id(EOS)
    labels = batch.input_ids[:, 1:]  # [B, L-1]
    answer = batch.answer_mask[:, 1:]
    # EOS tokens before this one in the answer region: 0 up to and including the first EOS
    is_eos = (labels == eos) & answer
    before = is_eos.long().cumsum(dim=1) - is_eos.long()
    keep = answer & (before == 0)
    return labels, keep.float()


def ar_loss(model, batch: Batch) -> torch.Tensor:
    """Mean next-token cross-entropy over the answer tokens (first EOS included)."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.key_padding_mask.long())
    labels, weight = answer_targets(batch)
    logits = out.logits[:, :-1].float()  # [B, L-1, V]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return (nll * weight.reshape(-1)).sum() / weight.sum().clamp_min(1.0)


@torch.no_grad()
def greedy_answers(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, batch_size: int = 64) -> list[list[int]]:
    """The model's greedy continuation of each prompt (cut after the first EOS), batched with left
    padding through ``model.generate``."""
    pad, eos = word_id(PAD), word_id(EOS)
    out: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in chunk])
        mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in chunk])[:, None]).long()
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad, eos_token_id=eos)[:, width:].tolist()
        for row in gen:
            out.append(row[:row.index(eos) + 1] if eos in row else row)
    return out


def exact_match(model, examples: Sequence[T.Example]) -> dict[str, float]:
    """Greedy exact match per task (the answer, then EOS) and the mean."""
    vocab = task_tokenizer().get_vocab()
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples]
    longest = max(T.answer_length(ex.task, ex.size) for ex in examples)
    answers = greedy_answers(model, prompts, longest)
    words = {i: w for w, i in vocab.items()}
    hits: dict[str, list[bool]] = {}
    for ex, ans in zip(examples, answers):
        region = [words.get(t, PAD) for t in ans]
        region += [EOS] * max(0, T.answer_length(ex.task, ex.size) - len(region))
        hits.setdefault(ex.task, []).append(T.score(ex, region))
    table = {k: sum(v) / len(v) for k, v in sorted(hits.items())}
    table["mean"] = sum(table.values()) / len(table)
    return table


def save_ar(model, directory: Union[str, Path], extra: Optional[dict] = None) -> Path:
    """``save_pretrained`` + the task tokenizer + ``training.json`` (recipe and evaluation)."""
    directory = Path(directory)
    model.save_pretrained(directory, safe_serialization=True)
    save_tokenizer(hf_tokenizer(), directory)  # PreTrainedTokenizerFast files: load on transformers 4.x and 5.x
    if extra is not None:
        (directory / "training.json").write_text(json.dumps(extra, indent=2, sort_keys=True, default=str) + "\n")
    return directory


def _optimizer(model, recipe: ARRecipe, lr: float, warmup: int, steps: int):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(
        s, warmup=warmup, total=steps, min_ratio=recipe.min_lr_ratio))
    return opt, sched


def overridden_ar_phases(recipe: ARRecipe, *, lr: Optional[float] = None,
                         warmup: Optional[int] = None) -> tuple[ARPhase, ...]:
    """``recipe.phases`` under a run's ``--lr`` / ``--warmup`` (None: not given), which replace the recipe's own
    ``lr`` / ``warmup``: each phase's peak lr scales by the same factor (it keeps its ratio to the recipe's) and
    each phase warms up ``warmup`` steps, as :func:`dllm.train.schedule.overridden_phases` does for a diffusion
    stage. (``--batch-size`` needs nothing here: every AR phase trains at the recipe's ``batch_size``.)"""
    scale = 1.0 if lr is None else lr / recipe.lr
    return tuple(replace(p, lr=p.lr * scale, warmup=p.warmup if warmup is None else warmup) for p in recipe.phases)


def phase_plan(recipe: ARRecipe) -> list[tuple[int, int, float, int, MixtureConfig]]:
    """(first step, steps, peak lr, warm-up, mixture) of every phase, the recipe's own first."""
    plan, start = [(0, recipe.steps, recipe.lr, recipe.warmup, recipe.mixture)], recipe.steps
    for ph in recipe.phases:
        plan.append((start, ph.steps, ph.lr, ph.warmup, ph.mixture))
        start += ph.steps
    return plan


def check_start(recipe: ARRecipe, start_phase: int, stop_at: Optional[int] = None) -> None:
    """Refuse a ``start_phase`` past the recipe's last phase (it would train nothing and save the initial
    weights as ``final/``) and a ``stop_at`` (a global step, as the phases count them) at or before the
    first step of ``start_phase``, naming the valid values."""
    plan = phase_plan(recipe)
    check_int("start_phase", start_phase, 0, high=len(plan) - 1,
              hint=f" (recipe {recipe.name!r} has {len(plan)} phase{'s' if len(plan) > 1 else ''})")
    first = plan[start_phase][0]
    if stop_at is not None and stop_at <= first:
        raise ValueError(f"stop_at={stop_at} ends before phase {start_phase} of recipe {recipe.name!r}, which "
                         f"trains steps {first + 1}..{first + plan[start_phase][1]}: pass a stop_at > {first}")


def train_ar(recipe: ARRecipe, out: Union[str, Path], *, threads: int = 0, progress: bool = True,
             stop_at: Optional[int] = None, start_phase: int = 0, init_from: Optional[Union[str, Path]] = None
             ) -> dict[str, Any]:
    """Train ``recipe`` into ``out`` (``log.jsonl``, ``phase-N/`` at the end of each phase, ``final/``);
    returns the last evaluation. Each phase starts a fresh AdamW and warm-up + cosine schedule, so
    ``start_phase=i, init_from=OUT/phase-(i-1)`` continues a run exactly where phase i begins."""
    from tqdm.auto import tqdm

    if stop_at is not None:
        check_int("stop_at", stop_at, 1, hint=" (stop after this many steps)")
    check_start(recipe, start_phase, stop_at)
    if threads > 0:
        torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_ar_model(recipe)
    if init_from is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(init_from, dtype=torch.float32)
    model.train()
    with (out / "log.jsonl").open("a") as log:  # closed however the run ends
        last: dict[str, Any] = {}
        t0 = time.perf_counter()
        for index, (first, steps, lr, warmup, mixture) in enumerate(phase_plan(recipe)):
            if index < start_phase:
                continue
            opt, sched = _optimizer(model, recipe, lr, warmup, steps)
            mix = TaskMixture(mixture, seed=recipe.seed, tokenizer=hf_tokenizer())
            examples = [ex for n in recipe.mixture.task_names() for ex in T.test_split(n, None, n=recipe.eval_per_size)]
            losses: list[float] = []
            end = first + steps if stop_at is None else min(stop_at, first + steps)
            for step in tqdm(range(first, end), disable=not progress, desc=f"{recipe.name} phase {index}"):
                loss = ar_loss(model, mix.batch(step, recipe.batch_size))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
                used = sched.get_last_lr()[0]  # this step's rate (after sched.step() it is the next step's)
                opt.step()
                sched.step()
                losses.append(float(loss.detach()))
                done = step + 1
                if done % recipe.log_every == 0:
                    log.write(json.dumps({"step": done, "loss": sum(losses) / len(losses), "lr": used,
                                          "elapsed_s": round(time.perf_counter() - t0, 1)}) + "\n")
                    log.flush()
                    losses.clear()
                if (recipe.eval_every and done % recipe.eval_every == 0) or done == end:
                    model.eval()
                    last = {"step": done, "eval": exact_match(model, examples)}
                    model.train()
                    log.write(json.dumps(last) + "\n")
                    log.flush()
            if end < first + steps:  # stopped inside this phase
                break
            model.eval()
            save_ar(model, out / f"phase-{index}", {"recipe": asdict(recipe), "evaluation": last})
            model.train()
    model.eval()
    save_ar(model, out / "final", {"recipe": asdict(recipe), "evaluation": last,
                                   "train_seconds": round(time.perf_counter() - t0, 1)})
    return last


__all__ = ["ARPhase", "ARRecipe", "check_start", "overridden_ar_phases", "phase_plan", "ar_loss", "ar_recipes",
           "answer_targets", "build_ar_model", "exact_match", "greedy_answers", "save_ar", "train_ar"]
