"""Ctrl-C in a long evaluation command: the finished part written, one line said, exit status 130.

``until_interrupted(body, finish)`` runs ``body()``; a KeyboardInterrupt anywhere in it (a progress
bar, a decode, a model load) calls ``finish()``, which writes what is finished and returns where it
went, prints ``interrupted: ...`` as one line and returns 130 (the shell's status for SIGINT). A
SIGTERM (``timeout``'s signal, ``kill``) does the same while ``body`` runs in the main thread, and
returns 143 (128 + SIGTERM).
``dllm stress``, ``dllm bench spec``, ``dllm bench trees``, ``dllm bench breakdown``, ``dllm compare`` and
``dllm eval tasks`` end this way.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator

INTERRUPTED = 130  # 128 + SIGINT
TERMINATED = 143  # 128 + SIGTERM


class _Terminated(KeyboardInterrupt):
    """A SIGTERM, raised where the main thread is, handled as a Ctrl-C."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside, a SIGTERM raises a KeyboardInterrupt (``_Terminated``) where the main thread is, so the
    code that saves a finished part on Ctrl-C does it on ``timeout`` and ``kill`` too; the handler
    before is restored after. In another thread (no handler can be set there) nothing changes."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        yield  # no handler can be set here, or the process was told to ignore SIGTERM: leave it so
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:  # a handler not set from Python reads as None: the default stands for it
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def until_interrupted(body: Callable[[], int], finish: Callable[[], str]) -> int:
    """``body()``'s status, or, on Ctrl-C, 130 after ``finish()`` (it saves the finished part and
    returns a short clause saying what and where) is printed as ``interrupted: <clause>``; on SIGTERM
    the same, 143 (``terminate_as_interrupt``)."""
    try:
        with terminate_as_interrupt():
            return body()
    except KeyboardInterrupt as stop:
        print(f"{'terminated' if isinstance(stop, _Terminated) else 'interrupted'}: {finish()}", flush=True)
        return TERMINATED if isinstance(stop, _Terminated) else INTERRUPTED


def finished(count: int, unit: str, where: str | None, hint: str = "") -> str:
    """``"3 finished rows are saved in out.json"`` (``where`` None: "... printed above; give --out to
    keep them"), then ``hint`` (e.g. "; rerun with --resume to continue")."""
    plural = unit if count == 1 else unit + "s"
    verb = "is" if count == 1 else "are"
    place = f"saved in {where}" if where else "printed above (nothing written: no output file was given)"
    return f"{count} finished {plural} {verb} {place}{hint}"


__all__ = ["INTERRUPTED", "TERMINATED", "finished", "terminate_as_interrupt", "until_interrupted"]
