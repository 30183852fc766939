"""The ``dllm`` command: ``dllm <command>`` for the everyday verbs (generate, compare, stress, spec,
samplers, drafters, tasks, info) and ``dllm <group> <command>`` for the rest (bench, eval, train, models).

- ``registry.py``: ``Command`` / ``Group`` / ``Registry``: lookup, help, exit statuses, Ctrl-C;
- ``table.py``: every command's row, the one place that names the modules the commands run;
- ``args.py``, ``core.py``, ``speculative.py`` (``dllm spec``), ``eval_args.py``, ``bench.py``: the
  flags (and runs) the CLI owns; ``canvas.py``: ``dllm generate --show``.

``dllm.cli:main`` is the console script; ``python -m dllm`` and ``python -m dllm.cli`` run it too.
"""

from __future__ import annotations

from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``dllm`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    from dllm.cli.table import REGISTRY

    return REGISTRY.main(argv)


__all__ = ["main"]
