"""dllm/eval/interrupt.py: Ctrl-C and SIGTERM (a ``timeout``) end a long command with its finished part saved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from dllm.eval.interrupt import INTERRUPTED, TERMINATED, until_interrupted


def test_sigterm_saves_the_finished_part_and_restores_the_handler(capsys):
    before = signal.getsignal(signal.SIGTERM)
    done = []

    def body() -> int:
        done.append("row 1")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        done.append("row 2")
        return 0

    assert until_interrupted(body, lambda: f"{len(done)} finished row is saved") == TERMINATED
    assert done == ["row 1"] and capsys.readouterr().out == "terminated: 1 finished row is saved\n"
    assert signal.getsignal(signal.SIGTERM) is before


def test_ctrl_c_still_says_interrupted(capsys):
    def body() -> int:
        raise KeyboardInterrupt

    assert until_interrupted(body, lambda: "nothing finished") == INTERRUPTED
    assert capsys.readouterr().out == "interrupted: nothing finished\n"


def test_timeout_of_a_command_keeps_its_finished_part(tmp_path):
    """As benchmarks/lib-gpu.sh runs a step: ``timeout`` sends SIGTERM at the limit."""
    script = tmp_path / "long.py"
    out = tmp_path / "rows.txt"
    script.write_text(textwrap.dedent(f"""
        import time
        from dllm.eval.interrupt import until_interrupted
        rows = []
        def body():
            for i in range(1000):
                rows.append(i)
                time.sleep(0.05)
            return 0
        def finish():
            open({str(out)!r}, "w").write(str(len(rows)))
            return f"{{len(rows)}} rows saved"
        raise SystemExit(until_interrupted(body, finish))
    """))
    run = subprocess.run(["timeout", "--preserve-status", "3", sys.executable, str(script)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == TERMINATED, run.stderr  # the command's own status (plain timeout says 124)
    assert int(out.read_text()) > 0 and "terminated:" in run.stdout


def test_an_ignored_sigterm_stays_ignored():
    from dllm.eval.interrupt import terminate_as_interrupt

    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with terminate_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
