"""The README's command table names every command of the CLI's table."""

from __future__ import annotations

from pathlib import Path

from dllm.cli.table import COMMANDS


def test_every_command_is_in_the_readme_table():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("## Commands"):readme.index("## Samplers")]
    missing = [f"{c.group} {c.name}".strip() for c in COMMANDS if f"`{c.name}" not in table and f" {c.name}`" not in table]
    assert not missing, f"README's command table lacks: {missing}"


def test_every_flag_has_help():
    """Each flag of a command built from the table says what it is (``--help`` shows it)."""
    import argparse

    from dllm.cli.registry import resolve

    missing = []
    for c in COMMANDS:
        if c.build is None:
            continue
        p = argparse.ArgumentParser()
        resolve(c.build)(p)
        missing += [f"{c.group} {c.name} {a.option_strings or a.dest}".strip() for a in p._actions
                    if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not missing, missing
