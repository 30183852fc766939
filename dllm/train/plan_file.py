"""A chain run's record, ``OUT/plan.json`` (``dllm/train/runner.py``): written by every run, read by a resume.

It holds the recipe name, ``max_steps``, the command line's training flags (``RunOptions.flags``:
:data:`TRAINING_FLAGS`, :func:`training_flags`), and where the chain started (``from_stage``, ``init_from``).
A resume giving another recipe, ``max_steps`` or training flags is refused by name (:func:`check_flags`);
``--resume`` alone starts where the run started (:func:`recorded_start`), and at that start another
``--init-from`` is refused. A ``plan.json`` written before the flags (or the start) were recorded is resumed
unchecked and records the resume's. :func:`time_limit_note` and :func:`resume_command` say how a run the time
limit stopped continues.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from dllm.train.data import task_list

if TYPE_CHECKING:
    import argparse

    from dllm.train.recipes.stages import Curriculum
    from dllm.train.runner import RunOptions

PLAN_FILE = "plan.json"
# The diffusion chain's flags that change what is trained (the model, the data, the schedule, the numerics, the
# evaluation set the best checkpoint is chosen by), as argparse dests: recorded, checked on --resume
TRAINING_FLAGS = ("tiny", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "tasks", "steps", "lr",
                  "warmup", "batch_size", "seed", "bf16", "eval_per_size")


def flag_of(dest: str) -> str:
    """The flag of an argparse dest (every ``dllm train`` flag is spelled as its dest)."""
    return "--" + dest.replace("_", "-")


def training_flags(ap: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The ``TRAINING_FLAGS`` given, by flag (``{"--lr": 0.01}``; ``--tasks`` as its canonical task names):
    what ``plan.json`` records and a resume is checked against (:func:`check_flags`)."""
    given: dict[str, Any] = {}
    for dest in TRAINING_FLAGS:
        value = getattr(args, dest)
        if dest == "tasks" and value:
            given[flag_of(dest)] = ",".join(task_list(value))
        elif dest != "tasks" and value != ap.get_default(dest):
            given[flag_of(dest)] = value
    return given


def check_flags(out: Path, recorded: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """A ValueError naming every training flag (``RunOptions.flags``) whose value in this resume differs
    from the one the run in ``out`` recorded, a flag given on one side only included, with both values."""
    def text(flag: str, value: Any) -> str:
        return f"no {flag}" if value is None or value is False else flag if value is True else f"{flag} {value}"

    differ = [f for f in sorted(set(recorded) | set(given)) if recorded.get(f) != given.get(f)]
    if differ:
        what = "; ".join(f"{f}: the run was started with {text(f, recorded.get(f))}, this resume gives "
                         f"{text(f, given.get(f))}" for f in differ)
        raise ValueError(f"{out} holds a run trained with other flags ({what}): a resume continues the same "
                         f"training, so pass the flags that change it as the run recorded them ({out / PLAN_FILE}), "
                         f"or use another --out")


def recorded_start(cur: Curriculum, opts: RunOptions) -> RunOptions:
    """A resume's ``from_stage`` and ``init_from`` as ``plan.json`` records them, so that ``--resume`` alone
    continues a chain started part-way (``--from-stage S --init-from X``) where it started. A ``from_stage``
    given other than the recorded one starts elsewhere and takes nothing from the record; at the recorded
    start, an ``init_from`` other than the recorded one is refused naming both (a stage with no checkpoint
    yet would start from other weights). A ``plan.json`` of another recipe (refused when it is written) or
    without the record (an older dllm) changes nothing."""
    path = opts.out / PLAN_FILE
    if not opts.resume or not path.is_file():
        return opts
    recorded = json.loads(path.read_text())
    if recorded.get("recipe") != cur.name or not {"from_stage", "init_from"} <= recorded.keys():
        return opts
    start = recorded["from_stage"]
    if opts.from_stage not in (None, start):
        return opts
    init = recorded["init_from"]
    if opts.init_from is not None and not same_init(opts.init_from, init):
        def text(value: Optional[str]) -> str:
            return "no --init-from" if value is None else f"--init-from {value}"

        where = f"stage {start!r}" if start else "its first stage"
        raise ValueError(f"{opts.out} holds a run started at {where} with {text(init)} ({path}), this resume gives "
                         f"{text(opts.init_from)}: a resume continues the same training, so leave --init-from out, "
                         f"or use another --out")
    return replace(opts, from_stage=start, init_from=opts.init_from or init)


def same_init(given: str, recorded: Optional[str]) -> bool:
    """Whether ``--init-from given`` names the ``recorded`` one: the same text, or the same directory."""
    return recorded is not None and (given == recorded or recorded_init(given) == recorded_init(recorded))


def recorded_init(init_from: Optional[str]) -> Optional[str]:
    """``init_from`` as ``plan.json`` records it: a directory as its absolute path (a resume may run from
    another working directory), a model name as given."""
    if init_from is None:
        return None
    path = Path(init_from).expanduser()
    return str(path.resolve()) if path.is_dir() else init_from


def check_plan_file(cur: Curriculum, opts: RunOptions) -> Optional[str]:
    """Refuse a run into ``out`` that holds another (see the module docstring), then write ``plan.json``.
    Returns a note for a resumed run whose ``plan.json`` records no training flags (written before they were)."""
    path = opts.out / PLAN_FILE
    want = {"recipe": cur.name, "max_steps": opts.max_steps}  # from/until may change between resumes
    note = None
    if path.is_file():
        recorded = json.loads(path.read_text())
        have = {k: recorded.get(k) for k in want}
        if not opts.resume:
            raise ValueError(f"{opts.out} already holds a run of recipe {have['recipe']!r}: pass --resume to "
                             f"continue it, or another --out")
        if have != want:
            raise ValueError(f"{opts.out} holds a run with {have}, this one is {want}: use another --out")
        if "flags" in recorded:
            check_flags(opts.out, recorded["flags"], opts.flags)
        else:
            note = (f"{path} records no training flags (written by an older dllm): this resume's are not "
                    f"checked, and are recorded for the next one")
    opts.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**want, "from_stage": opts.from_stage, "init_from": recorded_init(opts.init_from),
                                "flags": dict(opts.flags)}, indent=2) + "\n")
    return note


def time_limit_note(cur: Curriculum, opts: RunOptions, summary: Mapping[str, Any]) -> Optional[str]:
    """The line that ends a run the time limit stopped (its summary's ``stopped``): where, what is kept, and the
    command that continues it; None for a run that was not stopped."""
    stop = summary.get("stopped")
    if stop is None:
        return None
    saved = ", checkpointed" if stop["step"] else ", nothing to checkpoint"
    exported = f", exported as it is to {summary['export']}" if "export" in summary else ""
    return (f"not finished: the time limit ({opts.time_limit:g} s per stage) stopped stage {stop['stage']!r} at step "
            f"{stop['step']} of {stop['end']}{saved}{exported}; finished stages kept in {opts.out}: "
            f"{', '.join(summary['finished']) or 'none'}; continue with: {resume_command(cur, opts)}")


def resume_command(cur: Curriculum, opts: RunOptions) -> str:
    """The command that continues this run: the recipe, ``--out``, ``--resume``, what a resume must give as
    the run did (its training flags, ``--max-steps``: :func:`check_flags`) and its ``--until-stage``;
    ``--from-stage`` and ``--init-from`` are read from ``plan.json`` (:func:`recorded_start`)."""
    import shlex

    words = ["dllm", "train", "--recipe", cur.name, "--out", str(opts.out), "--resume"]
    for flag, value in opts.flags.items():
        words += [flag] if value is True else [flag, str(value)]
    for flag, value in (("--max-steps", opts.max_steps), ("--until-stage", opts.until_stage)):
        words += [flag, str(value)] if value is not None else []
    return shlex.join(words)


__all__ = ["PLAN_FILE", "TRAINING_FLAGS", "check_flags", "check_plan_file", "flag_of", "recorded_init",
           "recorded_start", "resume_command", "same_init", "time_limit_note", "training_flags"]
