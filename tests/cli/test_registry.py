"""The ``dllm`` command registry (``dllm/cli/registry.py``) and its table (``dllm/cli/table.py``)."""

from __future__ import annotations

import ast
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dllm
from dllm.cli import main
from dllm.cli.registry import Command, Group, Registry, exit_status, resolve
from dllm.cli.table import COMMANDS, GROUPS, REGISTRY

ROOT = Path(dllm.__file__).parent
REPO = ROOT.parent


def _words(c: Command) -> list[str]:
    return list(c.words)


def _needs(c: Command) -> None:
    """Skip a command whose optional package is missing here (lm-eval for ``dllm eval harness``)."""
    if c.words == ("eval", "harness") and importlib.util.find_spec("lm_eval") is None:
        pytest.skip("lm-eval is not installed")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c.words))
def test_every_command_prints_its_help(command, capsys, monkeypatch):
    _needs(command)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # lm-eval's command line (dllm eval harness) rewrites it
    with pytest.raises(SystemExit) as exit_:
        main([*_words(command), "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "-h, --help" in out


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c.words))
def test_every_target_and_builder_resolves(command):
    assert callable(resolve(command.target))
    if command.build is not None:
        assert callable(resolve(command.build))
    if command.stands_for is not None:
        assert hasattr(importlib.import_module(command.stands_for), "main")


def _python_m_entry_points() -> list[str]:
    """Every module under dllm/ that ``python -m`` runs: a ``def main`` and a ``__main__`` guard (or is a
    package's ``__main__.py``); the CLI's own package excepted."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if module.startswith("dllm.cli.") or module == "dllm.__main__":
            continue
        tree = ast.parse(path.read_text())
        has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
        guarded = path.name == "__main__.py" or any(
            isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
        if has_main and guarded:
            found.append(module)
    return found


def test_every_python_m_entry_point_is_a_registered_command():
    entry_points = _python_m_entry_points()
    assert "dllm.eval.speculative.bench" in entry_points and "dllm.train.__main__" in entry_points  # the scan works
    registered = {c.target.partition(":")[0] for c in COMMANDS if isinstance(c.target, str)}
    registered |= {c.stands_for for c in COMMANDS if c.stands_for}
    assert sorted(set(entry_points) - registered) == []


def test_top_help_lists_verbs_and_groups_not_aliases(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for c in REGISTRY.in_group(""):
        assert f"\n  {c.name} " in out, c.name
    for g in GROUPS:
        assert f"\n  {g.name} " in out and ", ".join(c.name for c in REGISTRY.in_group(g.name)) in out
    assert "eval-tasks" not in out  # one style: the canonical spellings only


@pytest.mark.parametrize("group", [g.name for g in GROUPS])
def test_group_help_lists_its_commands(group, capsys):
    assert main([group, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: dllm {group} <command>")
    for c in REGISTRY.in_group(group):
        assert f"\n  {c.name} " in out, c.name


def test_eval_help_points_to_the_verbs_it_also_spells(capsys):
    assert main(["eval", "--help"]) == 0
    out = capsys.readouterr().out
    assert "stress" in out and "= dllm stress" in out and "= dllm compare" in out


@pytest.mark.parametrize("alias,canonical", [(["eval-tasks"], "dllm eval tasks"), (["eval", "stress"], "dllm stress"),
                                             (["eval", "compare"], "dllm compare")])
def test_old_spellings_run_the_same_command(alias, canonical, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*alias, "--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"usage: {canonical} ")


@pytest.mark.parametrize("argv,message", [
    (["bogus"], "dllm: error: unknown command 'bogus'; commands: generate, compare, stress, spec, samplers"),
    (["sampler"], "unknown command 'sampler' (did you mean 'samplers'?)"),
    (["bench", "bogus"], "dllm bench: error: unknown command 'bogus'; valid: spec, trees, e2e, breakdown, kernels"),
    (["bench", "kernel"], "(did you mean 'kernels'?)"),
    (["eval", "--tasks"], "dllm eval: error: unknown command '--tasks'"),
    (["bench"], "dllm bench: error: give a command"),
    ([], "dllm: error: give a command"),
])
def test_an_unknown_group_or_command_is_an_error_listing_the_valid_ones(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    if argv[:1] == ["bogus"]:
        assert "groups: bench, eval, train, models" in err


def test_the_train_group_runs_its_recipe_command_when_a_flag_comes_first(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--recipe", "nope"])  # the recipe command's own parser refuses it
    assert exit_.value.code == 2
    assert "argument --recipe: invalid choice: 'nope'" in capsys.readouterr().err


def test_bench_kernels_refuses_a_device_this_machine_lacks(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["bench", "kernels", "--device", "cuda"]) == 2
    assert "device 'cuda': CUDA is not available" in capsys.readouterr().err
    assert main(["bench", "kernels", "--device", "gpu"]) == 2
    assert "device 'gpu' is not a device name; available devices: cpu" in capsys.readouterr().err


# A registry of test commands: what the dispatcher does around any command.

def _interrupt(argv):
    raise KeyboardInterrupt


def _interrupt_saved(argv):
    raise KeyboardInterrupt("finished rows are in runs/x.json")


def _own_line(argv):  # as `dllm stress` does: its own message, its own status
    print("interrupted: 2 finished cells are saved")
    return 130


def _bad(argv):
    raise ValueError(f"--n must be >= 1, got {argv[0]}")


def _missing(argv):
    import dllm_no_such_optional_package  # noqa: F401


def _broken(argv):
    import dllm.no_such_module  # noqa: F401


def _threads_args(p):
    p.add_argument("--threads", type=int, default=None)


def _threads(args):
    import torch

    return torch.get_num_threads()


TEST = Registry([Group("test", "test commands")], [
    Command("test", "boom", "raises KeyboardInterrupt", target=_interrupt),
    Command("test", "saved", "raises KeyboardInterrupt after saving", target=_interrupt_saved),
    Command("test", "own", "prints its own line", target=_own_line),
    Command("test", "bad", "raises ValueError", target=_bad),
    Command("test", "missing", "needs an optional package", target=_missing),
    Command("test", "broken", "a broken import inside dllm", target=_broken),
    Command("test", "threads", "reports torch's threads", build=_threads_args, target=_threads),
    Command("test", "list", "returns a value", target=lambda argv: list(argv), default=True),
])


def test_ctrl_c_is_one_line_and_exit_status_130(capsys):
    assert TEST.main(["test", "boom"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "dllm test boom: interrupted\n" and captured.out == ""


def test_ctrl_c_names_what_the_command_saved(capsys):
    assert TEST.main(["test", "saved"]) == 130
    assert capsys.readouterr().err == "dllm test saved: interrupted; finished rows are in runs/x.json\n"


def test_a_command_that_reports_its_own_interruption_is_left_alone(capsys):
    assert TEST.main(["test", "own"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "interrupted: 2 finished cells are saved\n" and captured.err == ""


def test_bad_input_is_one_error_line_and_exit_status_2(capsys):
    assert TEST.main(["test", "bad", "0"]) == 2
    assert capsys.readouterr().err == "dllm test bad: error: --n must be >= 1, got 0\n"


def test_a_missing_optional_package_is_named_and_a_broken_dllm_import_is_not_hidden(capsys):
    assert TEST.main(["test", "missing"]) == 2
    assert "dllm test missing: error: needs 'dllm_no_such_optional_package', which is not installed" in \
        capsys.readouterr().err
    with pytest.raises(ModuleNotFoundError, match="dllm.no_such_module"):
        TEST.main(["test", "broken"])


def test_threads_are_set_before_the_command_runs():
    import torch

    before = torch.get_num_threads()
    try:
        assert TEST.main(["test", "threads", "--threads", "2"]) == 2
        assert TEST.main(["test", "threads", "--threads", "1"]) == 1
    finally:
        torch.set_num_threads(before)


def test_a_default_command_gets_the_words_after_its_group():
    assert TEST.main(["test", "--x", "1"]) == 0  # a list is no status: 0
    assert exit_status(None) == 0 and exit_status(3) == 3 and exit_status(True) == 0 and exit_status([1]) == 0


@pytest.mark.parametrize("groups,commands,match", [
    ([], [Command("nope", "x", "", target=_bad)], "unknown group 'nope'"),
    ([Group("g", "")], [Command("g", "x", "", target=_bad), Command("g", "y", "", target=_bad, aliases=("g x",))],
     "'g x' names both 'dllm g x' and 'dllm g y'"),
    ([Group("g", "")], [Command("g", "x", "", target=_bad, default=True), Command("g", "y", "", target=_bad,
                                                                                 default=True)], "two default"),
    ([Group("g", "")], [Command("", "g", "", target=_bad)], "must be a verb or '<group> <command>'"),
    ([Group("g", "")], [Command("", "v", "", target=_bad, aliases=("h v",))], "must be a verb or"),
])
def test_a_bad_table_is_refused_when_the_registry_is_built(groups, commands, match):
    with pytest.raises(ValueError, match=match):
        Registry(groups, commands)


def _foreground_sigint() -> None:
    """In the child before exec: SIGINT delivered as in a foreground terminal. A test run started in
    the background by a non-interactive shell inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler: the command would never see the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_real_ctrl_c_in_a_process_prints_one_line_and_exits_130(tmp_path):
    """SIGINT to a running command: one line on stderr, no traceback, status 130."""
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from dllm.cli.registry import Command, Group, Registry

        def slow(argv):
            print("ready", flush=True)
            time.sleep(60)

        reg = Registry([Group("bench", "")], [Command("bench", "slow", "sleeps", target=slow)])
        sys.exit(reg.main(["bench", "slow"]))
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=_foreground_sigint)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err == "dllm bench slow: interrupted\n"


def test_help_imports_no_torch():
    """``dllm --help`` and ``dllm <group> --help`` read the table alone: no torch, no command module."""
    code = textwrap.dedent("""
        import contextlib, io, sys
        from dllm.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            for argv in (["--help"], ["bench", "--help"], ["eval", "--help"], ["train", "--help"],
                         ["models", "--help"], ["bogus"]):
                main(argv)
        print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in ("dllm", "torch", "numpy",
                                                                             "transformers"))))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["dllm", "dllm.cli", "dllm.cli.registry", "dllm.cli.table", "dllm.lazy"]


def test_python_m_dllm_is_the_command():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "dllm", "bench", "--help"], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert out.startswith("usage: dllm bench <command>")


def test_a_closed_pipe_is_no_error_line_and_exit_status_141(capsys):
    """``dllm tasks | head -1``: the reader went away; an OSError, but no bad input to report."""
    def gone(argv):
        raise BrokenPipeError(32, "Broken pipe")

    reg = Registry([], [Command("", "gone", "", target=gone)])
    assert reg.main(["gone"]) == 141
    assert capsys.readouterr().err == ""


def test_output_into_a_closed_pipe_in_a_process_is_silent(tmp_path):
    """A real closed pipe: no 'error: [Errno 32] Broken pipe', no 'Exception ignored' at the last flush."""
    script = tmp_path / "chatty.py"
    script.write_text(textwrap.dedent("""
        import sys
        from dllm.cli.registry import Command, Registry

        def chatty(argv):
            sys.stdin.readline()  # the test has closed its end of stdout by now
            for i in range(20000):
                print("row", i)

        sys.exit(Registry([], [Command("", "chatty", "", target=chatty)]).main(["chatty"]))
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    proc.stdout.close()
    _, err = proc.communicate("go\n", timeout=30)
    assert proc.returncode == 141 and err == ""
