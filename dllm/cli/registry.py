"""The command registry behind ``dllm``: one frozen ``Command`` per command, found by its words.

Every command is ``dllm <group> <command>`` (``dllm bench spec``, ``dllm train path-head``) or an
everyday verb (``dllm generate``: group ``""``); the rows live in ``dllm.cli.table``. A command is one
of two kinds, both imported only when it runs or prints its ``--help``, so ``dllm --help`` and
``dllm <group> --help`` read the table alone and never import torch:

- ``target="module:function"`` alone: ``function(argv) -> int | None`` owns its flags (its own
  argparse, ``--help`` too), exactly as ``python -m module`` runs it;
- ``build="module:function"`` and ``target``: ``build(parser)`` adds the flags to the command's parser
  (``prog`` is ``dllm <group> <command>``), ``target(args) -> int | None`` runs on the parsed namespace,
  after ``--threads N`` (when the command has it) has set torch's CPU threads.

Exit status: the target's int (None or any other value: 0); argparse's 2 for a bad flag; 2 with
``dllm <words>: error: <message>`` on stderr for a ValueError, TypeError, KeyError, OSError or
NotImplementedError (bad input the command found) and for an optional package that is not installed;
2 for an unknown group or command (the message lists the valid ones); 130 on Ctrl-C; 141 (the shell's
status for SIGPIPE), silently, when the reader of the output went away (``dllm tasks | head -1``,
``dllm spec --help | head -1``): stdout is flushed before the status is returned, and the help that argparse
prints (it ignores a failed write, then exits 0) is held until then.

Ctrl-C: the dispatcher catches KeyboardInterrupt around every command and prints one line on stderr,
``dllm bench spec: interrupted``, no traceback, exit status 130. A command that saves its finished
part says where by re-raising the interrupt with that as its message, which needs no import (the
commands live in layers below the CLI)::

    try:
        for row in rows:
            done.append(run(row))
            save(done, out)
    except KeyboardInterrupt:
        save(done, out)
        raise KeyboardInterrupt(f"finished rows are in {out}") from None

prints ``dllm bench spec: interrupted; finished rows are in runs/spec.json``. A command that prints its
own line and returns 130 (``dllm stress``: ``rerun with --resume``) is passed through as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import io
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

Target = Union[str, Callable[..., Any]]  # "module:function", or the function itself (tests, plugins)

INTERRUPTED = 130  # the shell's status for a process ended by SIGINT (128 + 2)
BROKEN_PIPE = 141  # the shell's status for a process ended by SIGPIPE (128 + 13): `dllm tasks | head -1`
USAGE_ERROR = 2
BAD_INPUT = (ValueError, TypeError, KeyError, OSError, NotImplementedError)
HELP = ("-h", "--help")


@dataclass(frozen=True)
class Group:
    """``dllm <name> <command>``: a named set of commands."""

    name: str
    help: str  # one line, shown by ``dllm --help``


@dataclass(frozen=True)
class Command:
    """One command: its words, its one-line help and what runs it (see the module docstring)."""

    group: str  # "" for an everyday verb (``dllm generate``), else a Group's name
    name: str
    help: str  # one line: the listings, and the description of the command's --help
    target: Target  # "module:function": function(argv) without ``build``, function(args) with it
    build: Optional[Target] = None  # "module:function": function(parser) adds the command's flags
    aliases: tuple[str, ...] = ()  # older or shorter spellings, words separated by spaces: "eval-tasks"
    default: bool = False  # the group's command when a flag comes first: ``dllm train --recipe X``
    stands_for: Optional[str] = None  # the ``python -m`` module this command runs when target is the CLI's own

    @property
    def words(self) -> tuple[str, ...]:
        return (self.group, self.name) if self.group else (self.name,)

    @property
    def prog(self) -> str:
        return " ".join(("dllm", *self.words))

    def run(self, argv: Sequence[str]) -> int:
        """Parse ``argv`` (the words after the command's) and run; exceptions are the caller's."""
        if self.build is None:
            return exit_status(resolve(self.target)(list(argv)))
        parser = argparse.ArgumentParser(prog=self.prog, description=self.help)
        resolve(self.build)(parser)
        args = parser.parse_args(list(argv))
        set_threads(getattr(args, "threads", None))
        return exit_status(resolve(self.target)(args))


def resolve(target: Target) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function (imported now); a callable is returned as it is."""
    if callable(target):
        return target
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"command target {target!r}: expected 'module:function'")
    return getattr(importlib.import_module(module), attr)


def exit_status(result: Any) -> int:
    """A target's return value as an exit status: an int as it is, anything else (None, a result) 0."""
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def set_threads(threads: Optional[int]) -> None:
    """``--threads N``: torch's CPU threads (None: torch's choice; torch is imported only when set)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


class UsageError(Exception):
    """An unknown group or command: the message lists the valid ones."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class Registry:
    """The groups and commands of one command line (``dllm``), checked once when built."""

    def __init__(self, groups: Sequence[Group], commands: Sequence[Command], prog: str = "dllm",
                 description: str = "") -> None:
        self.prog = prog
        self.description = description
        self.groups = {g.name: g for g in groups}
        self.commands: dict[tuple[str, ...], Command] = {}
        self.spellings: dict[tuple[str, ...], Command] = {}  # every way to name a command, its words first
        for c in commands:
            self._add(c)
        if len(self.groups) != len(groups):
            raise ValueError("two groups share a name")

    def _add(self, c: Command) -> None:
        if c.group and c.group not in self.groups:
            raise ValueError(f"command {c.name!r}: unknown group {c.group!r}; groups: {', '.join(self.groups)}")
        if not c.group and c.default:
            raise ValueError(f"command {c.name!r}: only a group's command can be its default")
        if c.default and self.default(c.group) is not None:
            raise ValueError(f"group {c.group!r}: two default commands")
        self.commands[c.words] = c
        for spelling in (c.words, *(tuple(a.split()) for a in c.aliases)):
            if spelling in self.spellings:
                raise ValueError(f"{' '.join(spelling)!r} names both {self.spellings[spelling].prog!r} and {c.prog!r}")
            one_word_group = len(spelling) == 1 and spelling[0] in self.groups
            if not 1 <= len(spelling) <= 2 or one_word_group or (len(spelling) == 2 and spelling[0] not in self.groups):
                raise ValueError(f"{c.prog}: spelling {' '.join(spelling)!r} must be a verb or '<group> <command>'")
            self.spellings[spelling] = c

    def in_group(self, group: str) -> list[Command]:
        return [c for c in self.commands.values() if c.group == group]

    def default(self, group: str) -> Optional[Command]:
        return next((c for c in self.in_group(group) if c.default), None)

    def find(self, argv: Sequence[str]) -> tuple[Command, list[str]]:
        """The command ``argv`` names and the words left for it; UsageError when it names none."""
        for n in (2, 1):
            if len(argv) >= n and tuple(argv[:n]) in self.spellings:
                return self.spellings[tuple(argv[:n])], list(argv[n:])
        word = argv[0]
        if word in self.groups:
            default = self.default(word)
            if default is not None and (len(argv) == 1 or argv[1].startswith("-")):
                return default, list(argv[1:])
            names = [c.name for c in self.in_group(word)]
            given = argv[1] if len(argv) > 1 else None
            what = f"unknown command {given!r}" if given else "give a command"
            raise UsageError(f"{self.prog} {word}", f"{what}{_close(given, names)}; valid: {', '.join(names)}")
        verbs = [c.name for c in self.in_group("")]
        raise UsageError(self.prog, f"unknown command {word!r}{_close(word, [*verbs, *self.groups])}; commands: "
                                    f"{', '.join(verbs)}; groups: {', '.join(self.groups)}")

    def main(self, argv: Optional[Sequence[str]] = None) -> int:
        """Run the command ``argv`` names (default ``sys.argv[1:]``) and return its exit status, stdout flushed."""
        argv = list(sys.argv[1:] if argv is None else argv)
        return flushed(lambda: self._dispatch(argv), hold=asks_help(argv))

    def _dispatch(self, argv: list[str]) -> int:
        if not argv or argv[0] in HELP:
            if not argv:
                print(f"{self.format_help()}\n\n{self.prog}: error: give a command", file=sys.stderr)
                return USAGE_ERROR
            print(self.format_help())
            return 0
        if argv[0] in self.groups and (len(argv) == 1 or argv[1] in HELP):
            if len(argv) > 1:
                print(self.format_group_help(argv[0]))
                return 0
            if self.default(argv[0]) is None:  # `dllm train` alone runs its default command
                print(f"{self.format_group_help(argv[0])}\n\n{self.prog} {argv[0]}: error: give a command",
                      file=sys.stderr)
                return USAGE_ERROR
        try:
            command, rest = self.find(argv)
        except UsageError as err:
            print(f"{err.prog}: error: {err}", file=sys.stderr)
            return USAGE_ERROR
        return run_guarded(command, rest)

    def format_help(self) -> str:
        verbs = self.in_group("")
        width = max(len(n) for n in [*(c.name for c in verbs), *self.groups])
        lines = [f"usage: {self.prog} <command> [options]", f"       {self.prog} <group> <command> [options]", ""]
        lines += [self.description, ""] if self.description else []
        lines += ["commands:", *(f"  {c.name:<{width}}  {c.help}" for c in verbs), ""]
        lines += [f"groups ({self.prog} <group> --help lists their commands):"]
        for g in self.groups.values():
            lines += [f"  {g.name:<{width}}  {g.help}",
                      f"  {'':<{width}}  {', '.join(c.name for c in self.in_group(g.name))}"]
        lines += ["", f"{self.prog} <command> --help shows a command's options.",
                  "Ctrl-C ends any command (exit status 130), keeping what it finished."]
        return "\n".join(lines)

    def format_group_help(self, group: str) -> str:
        commands = self.in_group(group)
        here = [(spelling[1], c) for spelling, c in self.spellings.items()
                if len(spelling) == 2 and spelling[0] == group and c.group != group]
        width = max(len(n) for n in [*(c.name for c in commands), *(w for w, _ in here)])
        default = self.default(group)
        lines = [f"usage: {self.prog} {group} <command> [options]"]
        if default is not None:
            lines += [f"       {self.prog} {group} [options]    (= {default.prog})"]
        lines += ["", self.groups[group].help, "", "commands:"]
        lines += [f"  {c.name:<{width}}  {c.help}" for c in commands]
        lines += [f"  {w:<{width}}  = {c.prog}" for w, c in here]
        lines += ["", f"{self.prog} {group} <command> --help shows a command's options."]
        return "\n".join(lines)


def run_guarded(command: Command, argv: Sequence[str]) -> int:
    """``command.run(argv)`` with bad input as one error line and Ctrl-C as one line (module docstring)."""
    try:
        return command.run(argv)
    except KeyboardInterrupt as err:
        note = f"; {err.args[0]}" if err.args and err.args[0] else ""
        print(f"{command.prog}: interrupted{note}", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # an OSError, but no bad input: the reader closed the pipe (`| head`)
        _silence_stdout()
        return BROKEN_PIPE
    except BAD_INPUT as err:
        print(f"{command.prog}: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    except ImportError as err:  # an optional package (matplotlib, lm-eval, triton) that is not installed
        if not err.name or err.name.split(".")[0] == "dllm":
            raise  # a broken import inside dllm is a bug: keep its traceback
        print(f"{command.prog}: error: needs {err.name!r}, which is not installed "
              f"(install it; the extras dllm[eval] and dllm[triton] hold the optional packages)", file=sys.stderr)
        return USAGE_ERROR


def asks_help(argv: Sequence[str]) -> bool:
    """Whether ``argv`` holds ``-h`` or ``--help`` before a ``--`` (argparse then prints the help and exits)."""
    words = list(argv)
    before = words[:words.index("--")] if "--" in words else words
    return any(w in HELP for w in before)


def flushed(run: Callable[[], int], hold: bool = False) -> int:
    """``run()``'s status after stdout is flushed, or 141 (``BROKEN_PIPE``, nothing on stderr) when the reader
    went away: the flush inside the guard, not the interpreter's last one ("Exception ignored ... BrokenPipeError",
    exit status 120). hold: stdout goes to memory while ``run()`` runs and is written after it, also when it
    exits (SystemExit): argparse's ``--help`` ignores a failed write (``ArgumentParser._print_message`` in
    CPython's Lib/argparse.py) and exits 0, which an unbuffered stdout (``python -u``) would make the status.
    No stdout at all (``sys.stdout`` None: started with descriptor 1 closed, ``dllm tasks >&-``): ``run()`` as it
    is, since print() then writes nothing and argparse prints its help on stderr."""
    if sys.stdout is None:
        return run()
    held = io.StringIO() if hold else None
    try:
        try:
            with contextlib.redirect_stdout(held) if held is not None else contextlib.nullcontext():
                status = run()
        except SystemExit:  # argparse: --help (0), a bad flag (2)
            _write_out(held)
            raise
        _write_out(held)
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE
    return status


def _write_out(held: Optional[io.StringIO]) -> None:
    """Write what was held (if anything) to stdout and flush it; BrokenPipeError is the caller's."""
    if held is not None and held.getvalue():
        sys.stdout.write(held.getvalue())
    sys.stdout.flush()


def _silence_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so the interpreter's last flush of what the closed pipe did
    not take fails no more ("Exception ignored ... BrokenPipeError"); the recipe of Python's ``signal``
    docs ("Note on SIGPIPE"). A stdout with no descriptor (a test's capture) is left as it is."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _close(word: Optional[str], valid: Sequence[str]) -> str:
    """``" (did you mean 'spec'?)"`` when ``word`` is a near miss of a valid name, else ""."""
    near = difflib.get_close_matches(word, valid, n=1) if word else []
    return f" (did you mean {near[0]!r}?)" if near else ""


__all__ = ["Command", "Group", "Registry", "UsageError", "resolve", "run_guarded", "flushed", "asks_help",
           "exit_status", "set_threads", "INTERRUPTED", "USAGE_ERROR", "BROKEN_PIPE"]
