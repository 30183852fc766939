"""Run a :class:`~dllm.train.recipes.stages.Curriculum` end to end: every stage in order, each from the
checkpoint the previous one ends at, then the export.

Output directory layout::

    OUT/plan.json                  the recipe name, max_steps and the training flags (checked on --resume),
                                   from_stage, init_from
    OUT/<stage>/                   the trainer's directory (dllm/train/trainer.py): checkpoints, log.jsonl
    OUT/<stage>/stage.json         written when the stage is finished: its step and the checkpoint taken
    OUT/export/<recipe>/           the exported model (dllm.train.export; loads with dllm.load(path))

Resuming (``resume=True``) skips the finished stages and continues the unfinished one from its newest
checkpoint (``Trainer(resume=True)``: bit-identical losses). A ``max_steps`` run (a smoke test: every
stage stops after at most that many steps, its schedule unchanged) is recorded in ``plan.json`` and
cannot be resumed as a full run (another ``--out`` is needed), nor the other way round. So are the
command line's flags that change what is trained (``RunOptions.flags``: ``--lr``, ``--tasks``, ``--tiny``,
... ``dllm.train.plan_file.TRAINING_FLAGS``): a resume giving others, or leaving one out, is refused
by name (:func:`check_flags`); a ``plan.json`` written before they were recorded is resumed unchecked
and records the resume's. ``--resume`` alone starts where the run started (its ``from_stage`` and
``init_from``: ``dllm/train/plan_file.py``). A recipe edited between runs is applied as it is (a longer
horizon or a new phase from the newest checkpoint on; a changed model shape fails when the checkpoint loads).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from dllm.train.plan_file import PLAN_FILE, check_flags, check_plan_file, recorded_start
from dllm.train.recipes.base import Recipe
from dllm.train.recipes.stages import Curriculum, Stage

DONE_FILE = "stage.json"
EXPORT_DIR = "export"


@dataclass(frozen=True)
class RunOptions:
    """How to run a curriculum (None: the recipe's own value)."""

    out: Path
    resume: bool = False
    progress: bool = True
    threads: Optional[int] = None  # every stage's torch threads (default: each stage's as run)
    device: Optional[str] = None
    max_steps: Optional[int] = None  # smoke runs: stop every stage after this many steps
    from_stage: Optional[str] = None  # skip the stages before this one
    until_stage: Optional[str] = None  # stop after this one (it is exported)
    init_from: Optional[str] = None  # the weights the first trained stage starts from (a model name or a directory)
    time_limit: Optional[float] = None  # seconds per stage (the step reached is checkpointed, the chain stops)
    export: bool = True
    # the command line's flags that change what is trained, as given (``{"--lr": 0.01, "--tiny": True}``): recorded
    # in plan.json by the first run, and a resume giving other ones is refused (check_flags)
    flags: Mapping[str, Any] = field(default_factory=dict)


class StageInterrupted(Exception):
    """Ctrl-C inside a stage: the finished stages are kept, the stage continues with ``--resume``."""

    def __init__(self, stage: str, step: int, finished: list[str]) -> None:
        super().__init__(stage, step, finished)
        self.stage, self.step, self.finished = stage, step, finished


def check_options(cur: Curriculum, opts: RunOptions) -> None:
    """Refuse bad options by name before anything runs."""
    if opts.max_steps is not None and (not isinstance(opts.max_steps, int) or opts.max_steps < 1):
        raise ValueError(f"max_steps must be an integer >= 1, got {opts.max_steps!r}")
    if opts.threads is not None and (not isinstance(opts.threads, int) or opts.threads < 0):
        raise ValueError(f"threads must be an integer >= 0 (0: torch's default), got {opts.threads!r}")
    if opts.time_limit is not None and not opts.time_limit > 0:
        raise ValueError(f"time_limit must be > 0 seconds, got {opts.time_limit!r}")
    if opts.device is not None:
        from dllm.models.loading import resolve_device

        resolve_device(opts.device)  # ValueError naming the devices that exist
    for name in (opts.from_stage, opts.until_stage):
        if name is not None:
            cur.stage(name)  # ValueError listing the stages
    if selected(cur, opts) == ():
        raise ValueError(f"until_stage {opts.until_stage!r} comes before from_stage {opts.from_stage!r}")


def selected(cur: Curriculum, opts: RunOptions) -> tuple[Stage, ...]:
    """The stages this run trains (``from_stage`` .. ``until_stage``)."""
    names = [s.name for s in cur.stages]
    first = names.index(opts.from_stage) if opts.from_stage else 0
    last = names.index(opts.until_stage) if opts.until_stage else len(names) - 1
    return cur.stages[first:last + 1]


def stage_end(stage: Stage, opts: RunOptions, override: Callable[[Recipe], Recipe] = lambda r: r) -> int:
    """The last step this run trains of ``stage``: its schedule's horizon as ``override`` sets it (``--steps``),
    or its ``stop_at`` when that comes first, and at most ``max_steps``. A stage that reaches it is finished."""
    horizon = override(stage.recipe).train.steps
    end = horizon if stage.stop_at is None else min(stage.stop_at, horizon)
    return end if opts.max_steps is None else min(end, opts.max_steps)


def stage_recipe(stage: Stage, opts: RunOptions, init: Optional[str],
                 override: Callable[[Recipe], Recipe] = lambda r: r) -> Recipe:
    """The stage's recipe as this run trains it: its init, and the thread / device overrides."""
    recipe = override(replace(stage.recipe, init_from=init))
    train = {k: v for k, v in (("threads", opts.threads), ("device", opts.device)) if v is not None}
    return replace(recipe, train=replace(recipe.train, **train)) if train else recipe


def first_init(cur: Curriculum, opts: RunOptions, override: Callable[[Recipe], Recipe] = lambda r: r
               ) -> Optional[str]:
    """Where the first trained stage starts: ``init_from`` (refused when it names no model), its own
    ``init_from``, or (from_stage) the checkpoint the previous stage took under ``out`` when it finished
    (:func:`previous_taken`); a previous stage not finished there is refused."""
    stage = selected(cur, opts)[0]
    if opts.init_from is not None:
        from dllm.models.loading import ModelNotFoundError, locate

        try:
            locate(opts.init_from)
        except ModelNotFoundError as err:
            raise ValueError(f"init_from {opts.init_from!r} (--init-from): {err}") from None
        return opts.init_from
    index = cur.stages.index(stage)
    if index == 0:
        return stage.recipe.init_from
    path = previous_taken(cur, stage, opts, override)
    if path is not None:
        return path
    from dllm.train.trainer import checkpoints

    prev = cur.stages[index - 1]
    found, end = checkpoints(opts.out / prev.name), stage_end(prev, opts, override)
    if not found:
        raise ValueError(f"stage {stage.name!r} starts from stage {prev.name!r}, which is not under {opts.out}: "
                         f"pass init_from (--init-from MODEL_OR_DIR) or start earlier")
    raise ValueError(f"stage {stage.name!r} starts from stage {prev.name!r}, which is not finished under {opts.out} "
                     f"(its newest checkpoint is {found[-1].name} of {end} steps): finish it first (--from-stage "
                     f"{prev.name} --resume), or pass init_from (--init-from MODEL_OR_DIR)")


def previous_taken(cur: Curriculum, stage: Stage, opts: RunOptions,
                   override: Callable[[Recipe], Recipe] = lambda r: r) -> Optional[str]:
    """The checkpoint the stage before ``stage`` took when it finished under ``out`` (:func:`finished_source`,
    or its stop step's checkpoint for a ``take="last"`` stage finished before ``stage.json`` was written);
    None when it is not finished there. What a run from ``stage`` starts from, and its dry run names."""
    prev = cur.stages[cur.stages.index(stage) - 1]
    directory, end = opts.out / prev.name, stage_end(prev, opts, override)
    path = finished_source(directory, prev, end)
    if path is None and prev.take == "last" and (directory / prev.source(end)).is_dir():
        path = str(directory / prev.source(end))
    return path


def finished_source(directory: Path, stage: Stage, end: int) -> Optional[str]:
    """The checkpoint a stage finished in ``directory`` (its ``stage.json`` records a step >= ``end``) was taken
    from, found under ``directory`` as the run goes now (the recorded path holds the first run's ``--out``,
    relative to its working directory); None for a stage not finished."""
    done = directory / DONE_FILE
    if not done.is_file():
        return None
    record = json.loads(done.read_text())
    if record.get("step", -1) < end:
        return None
    path = taken(directory, stage, end)
    return record["taken"] if path is None else str(path)


def taken(directory: Path, stage: Stage, end: int) -> Optional[Path]:
    """The checkpoint the chain continues from: ``best`` or the stop step's; a stage stopped early
    without an evaluation (a smoke run) falls back to its newest checkpoint."""
    path = directory / stage.source(end)
    if path.is_dir():
        return path
    from dllm.train.trainer import checkpoints

    found = checkpoints(directory)
    return found[-1] if found else None


def plan(cur: Curriculum, opts: RunOptions, override: Callable[[Recipe], Recipe] = lambda r: r) -> list[str]:
    """One line per stage (what it starts from, steps, lr, batch, warm-up, RoPE base, threads, seed, the
    task mixture with weights and size ranges, later phases), then the export line."""
    from dllm.train.trainer import check_intervals

    opts = recorded_start(cur, opts)
    check_options(cur, opts)
    lines = [f"recipe {cur.name}: {cur.description}"
             + (f" (replaces benchmarks/{', benchmarks/'.join(cur.replaces)})" if cur.replaces else "")]
    stages = selected(cur, opts)
    prev: Optional[Stage] = None
    for i, stage in enumerate(stages):
        index = cur.stages.index(stage)
        if i == 0:
            before = cur.stages[index - 1] if index else None
            init = opts.init_from or stage.recipe.init_from or (  # as the run: found under out, if there
                (previous_taken(cur, stage, opts, override)
                 or f"{before.name}/{before.source(stage_end(before, opts, override))}") if before else None)
        else:
            init = f"{prev.name}/{prev.source(stage_end(prev, opts, override))}"
        r = stage_recipe(stage, opts, init, override)
        check_intervals(r.train)  # a bad count or rate is refused here as in run()
        t, end = r.train, stage_end(stage, opts, override)
        steps = f"steps {end}" + (f" of {t.steps}" if end != t.steps else "")
        lines.append(f"{index + 1:>3}. {stage.name}: from {init or 'a fresh init (seed %d)' % t.seed}; {steps}, "
                     f"lr {t.lr:g}, batch {t.batch_size}, warmup {t.warmup}, rope_theta {r.model['rope_theta']:g}, "
                     f"vocab {r.model['vocab_size']}, threads {t.threads}, seed {t.seed}, device {t.device}"
                     f"{', bf16' if t.bf16 else ''}; take {stage.source(end)}")
        lines.append(f"       mix {mixture_text(t.mixture)}")
        for p in t.phases:
            if p.start < end:
                lines.append(f"       from step {p.start}: lr {p.lr:g}, warmup {p.warmup}"
                             f"{f', horizon {p.horizon}' if p.horizon else ''}"
                             f"{f', batch {p.batch_size}' if p.batch_size else ''}; mix {mixture_text(p.mixture)}")
        prev = stage
    last = stages[-1]
    source = last.source(stage_end(last, opts, override))
    lines.append(f"export: {last.name}/{source} -> {opts.out / EXPORT_DIR / cur.name} ({cur.export_dtype})"
                 if opts.export else "export: none")
    return lines


def mixture_text(mix) -> str:
    """``task:weight[:lo-hi]`` per task (the full size range when the mixture gives none)."""
    names, weights = mix.task_names(), mix.weights or (1.0,) * len(mix.task_names())
    sizes = mix.sizes or ((),) * len(names)
    return " ".join(f"{n}:{w:g}" + (f":{min(s)}-{max(s)}" if s else "") for n, w, s in zip(names, weights, sizes))


@dataclass
class _Progress:
    """Where a run is (for the one-line Ctrl-C message)."""

    stage: str = "setup"
    trainer: object = None
    finished: list = field(default_factory=list)


def run(cur: Curriculum, opts: RunOptions, override: Callable[[Recipe], Recipe] = lambda r: r,
        log: Callable[[str], None] = print) -> dict:
    """Train every selected stage (skipping finished ones on resume), then export. Returns a summary;
    Ctrl-C anywhere raises :class:`StageInterrupted` (the finished stages stay on disk)."""
    from dllm.train.trainer import check_intervals

    opts = recorded_start(cur, opts)  # --resume alone continues a chain started part-way where it started
    check_options(cur, opts)
    init = first_init(cur, opts, override)  # before plan.json is written: a refused start leaves nothing behind
    for stage in selected(cur, opts):  # every stage's steps and intervals, before plan.json too
        check_intervals(stage_recipe(stage, opts, init, override).train)
    note = check_plan_file(cur, opts)
    if note:
        log(note)
    progress = _Progress()
    try:
        return _run(cur, opts, init, override, log, progress)
    except KeyboardInterrupt:
        step = getattr(progress.trainer, "step", 0)
        raise StageInterrupted(progress.stage, step, progress.finished) from None


def _run(cur: Curriculum, opts: RunOptions, init: Optional[str], override: Callable[[Recipe], Recipe],
         log: Callable[[str], None], progress: _Progress) -> dict:
    from dllm.train.trainer import Trainer, checkpoints

    stages = selected(cur, opts)
    finished = progress.finished
    last: dict = {}
    stopped = None
    for stage in stages:
        directory, end = opts.out / stage.name, stage_end(stage, opts, override)
        progress.stage, progress.trainer = stage.name, None
        done, kept = directory / DONE_FILE, finished_source(directory, stage, end)
        if kept is not None:
            init = kept
            finished.append(stage.name)
            log(f"[{cur.stages.index(stage) + 1}/{len(cur.stages)}] {stage.name}: finished (kept)")
            continue
        if checkpoints(directory) and not opts.resume:
            raise ValueError(f"{directory} already has checkpoints: pass --resume to continue, or another --out")
        recipe = stage_recipe(stage, opts, init, override)
        log(f"[{cur.stages.index(stage) + 1}/{len(cur.stages)}] {stage.name}: {steps_text(stage, recipe, end)}, "
            f"from {init or 'a fresh init'}")
        trainer = progress.trainer = Trainer(recipe, directory, resume=opts.resume, progress=opts.progress)
        last = {**trainer.train(stop_at=end, time_limit=opts.time_limit), "step": trainer.step,
                "best_mean_c0": trainer.best}  # the step reached (the log line may be older)
        if trainer.step < end:  # the trainer stops short of end only when out of time (step reached checkpointed)
            if opts.time_limit is None:
                raise RuntimeError(f"stage {stage.name!r}: the trainer stopped at step {trainer.step} of {end} "
                                   f"without a time limit (its schedule's horizon: {recipe.train.steps})")
            stopped = {"stage": stage.name, "step": trainer.step, "end": end}
            log(f"{stage.name}: time limit of {opts.time_limit:g} s reached at step {trainer.step} of {end} "
                f"({'checkpointed' if trainer.step else 'no step to checkpoint'}; the chain stops here, --resume "
                f"continues the stage)")
            break
        path = taken(directory, stage, end)
        done.write_text(json.dumps({"stage": stage.name, "step": trainer.step, "taken": str(path),
                                    "init_from": init}, indent=2) + "\n")
        finished.append(stage.name)
        init = str(path)
    summary = {"out": str(opts.out), "recipe": cur.name, "finished": list(finished), **last,
               **({"stopped": stopped} if stopped else {})}
    if opts.export and (stopped is None or stopped["stage"] == stages[-1].name):
        progress.stage, progress.trainer = "export", None
        summary["export"] = str(export_last(cur, stages[-1], opts, override))
    return summary


def steps_text(stage: Stage, recipe: Recipe, end: int) -> str:
    """``steps END``, with the schedule's horizon when the stage stops before it, and the stage's own length
    when this run's ``recipe`` (``--steps``) sets another horizon."""
    def length(stop: int, horizon: int) -> str:
        return f"steps {stop}" + (f" of {horizon}" if stop < horizon else "")

    text, own = length(end, recipe.train.steps), stage.recipe.train.steps
    if recipe.train.steps != own:
        text += f" (horizon {recipe.train.steps} set by --steps; the stage's own: {length(stage.end, own)})"
    return text


def export_last(cur: Curriculum, stage: Stage, opts: RunOptions,
                override: Callable[[Recipe], Recipe] = lambda r: r) -> Path:
    """The last stage's taken checkpoint as ``OUT/export/<recipe>`` (official files + training.json)."""
    from dllm.train.export import export

    directory = opts.out / stage.name
    path = taken(directory, stage, stage_end(stage, opts, override))
    if path is None:
        raise ValueError(f"stage {stage.name!r} left no checkpoint under {directory}")
    note = (f"python -m dllm.train --recipe {cur.name}: stages "
            f"{', '.join(s.name for s in selected(cur, opts))}"
            + (f" (max_steps {opts.max_steps})" if opts.max_steps else ""))
    return export(directory, cur.name, path.name, cur.export_dtype, root=opts.out / EXPORT_DIR, note=note)


__all__ = ["PLAN_FILE", "RunOptions", "StageInterrupted", "check_flags", "check_options", "export_last",
           "mixture_text", "plan", "previous_taken", "run", "selected", "stage_end", "stage_recipe", "taken"]
