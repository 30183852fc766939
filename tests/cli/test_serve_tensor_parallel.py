"""``dllm serve --tensor-parallel N``: one HTTP front end, N model ranks (this process and N-1 it starts).

Fast: the flags a split server refuses before anything starts. Slow: a real 2-rank server answers
the official openai client with the offline tokens (concurrent, streamed, seeded sampling, a stop
string, two samplers and caches), and SIGTERM or Ctrl-C stops every rank with no orphans.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import time

import pytest

from dllm.cli.table import REGISTRY
from tests.cli.test_cli_serve import ROOT, start_server


@pytest.mark.parametrize("argv,says", [
    (["--model", "tiny-llada", "--tensor-parallel", "2", "--mode", "continuous"],
     "--tensor-parallel serves with --mode static or serial"),
    (["--model", "tiny-llada", "--tensor-parallel", "2", "--quantization", "int8"], "--quantization int8 is not supported"),
    (["--model", "tiny-llada", "--expert-parallel"], "--expert-parallel goes with --tensor-parallel N"),
    (["--target", "tiny-ar", "--drafter", "ngram", "--tensor-parallel", "2"], "--tensor-parallel is a diffusion setting"),
    (["--model", "tiny-llada", "--tensor-parallel", "3"], "attention heads 4 is not divisible by tensor_parallel=3"),
    (["--model", "tiny-llada", "--tensor-parallel", "2", "--expert-parallel"], "needs a mixture-of-experts model"),
])
def test_a_split_server_is_refused_before_any_rank_starts(argv, says, capsys, monkeypatch):
    import dllm.serve.backends.tensor_parallel as tp

    monkeypatch.setattr(tp, "spawn_followers", lambda *a, **k: pytest.fail("a rank was started"))
    assert REGISTRY.main(["serve", "--port", "0", *argv]) == 2
    assert says in capsys.readouterr().err


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _tagged_ranks(tag: str) -> list[int]:
    """Follower ranks (``python -m dllm.serve.backends.tensor_parallel``) whose environment carries
    ``DLLM_TEST_TAG=tag``: found by what they inherited, not by parentage, which Ray's worker processes
    need not keep (its workers may be re-parented to a reaper)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if b"dllm.serve.backends.tensor_parallel" in args and f"DLLM_TEST_TAG={tag}".encode() in env:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_two_ranks_answer_the_openai_client_with_the_offline_tokens(tmp_path, sig):
    from openai import OpenAI

    import dllm
    from tests.serve.servers import offline_diffusion

    proc, url, log = start_server(tmp_path, "--model", "tiny-llada", "--tensor-parallel", "2")
    followers = _children(proc.pid)
    try:
        assert len(followers) == 1, log.read_text()
        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        model = dllm.load("tiny-llada")
        asks = [dict(prompt="[BOS] sort D A C B [SEP]", max_tokens=8),
                dict(prompt="[BOS] reverse A B C D [SEP]", max_tokens=8, extra_body={"sampler": "threshold",
                                                                                  "cache": "dual"}),
                dict(prompt="[BOS] sort C B A [SEP]", max_tokens=12, temperature=1.0, seed=5),
                dict(prompt="[BOS] sort C B A [SEP]", max_tokens=12, temperature=1.0, seed=5),
                dict(prompt="[BOS] copy A B C D E F [SEP]", max_tokens=12, stop=["D"])]

        def offline(a: dict) -> str:
            extra = a.get("extra_body", {})
            settings = {k: v for k, v in (("temperature", a.get("temperature")), ("seed", a.get("seed"))) if v}
            return offline_diffusion(model, a["prompt"], a["max_tokens"], a.get("stop", ()), **extra, **settings)[0]

        with cf.ThreadPoolExecutor(8) as ex:
            got = list(ex.map(lambda a: client.completions.create(model="tiny-llada", **a).choices[0].text, asks * 2))
        assert got == [offline(a) for a in asks * 2]
        stream = client.completions.create(model="tiny-llada", stream=True, **asks[0])
        assert "".join(c.choices[0].text for c in stream) == offline(asks[0])
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0, log.read_text()
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in followers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in followers), "a rank outlived the server"
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_a_ray_replica_holds_a_tensor_parallel_group(tmp_path):
    """``--replicas 1 --tensor-parallel 2``: the replica is rank 0 of its own group (its follower started
    by the replica's process); its answers equal the offline ones; SIGTERM leaves no rank behind."""
    pytest.importorskip("ray.serve")
    import socket as _socket

    from openai import OpenAI

    import dllm
    from tests.serve.servers import offline_diffusion

    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log, tag = tmp_path / "serve.log", f"ray-tp-{os.getpid()}-{port}"
    proc = subprocess.Popen([sys.executable, "-m", "dllm.cli", "serve", "--model", "tiny-llada", "--tensor-parallel",
                             "2", "--replicas", "1", "--port", str(port), "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"), cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "DLLM_TEST_TAG": tag})
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        deadline = time.monotonic() + 240
        while "is ready at" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        followers = _tagged_ranks(tag)
        ranks = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
        assert len(followers) == 1, [r for r in ranks.splitlines() if "tensor_parallel" in r] + [log.read_text()[-2000:]]
        prompt = "[BOS] sort D A C B [SEP]"
        got = client.completions.create(model="tiny-llada", prompt=prompt, max_tokens=8).choices[0].text
        assert got == offline_diffusion(dllm.load("tiny-llada"), prompt, 8)[0]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in followers) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(_alive(p) for p in followers), "a rank outlived the server"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
