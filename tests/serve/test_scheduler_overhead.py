"""The step loop's own work, counted on its thread with a dispatch-mode counter (what a GPU's host
would issue): continuous batching spends no more ATen calls and host syncs outside the model's
forwards than static batching for the same requests, and no mode reads the canvas back more than
once per decode step."""

from __future__ import annotations

import pytest

from dllm.eval.bench.counters import DispatchCounter
from dllm.eval.bench.serving.serve import stress_requests
from dllm.scoring.exact_match import load_model
from dllm.serve.backends.diffusion import DiffusionBackend
from dllm.serve.backends.scheduler import Scheduler
from dllm.serve.backends.jobs import Done, JobRequest
from dllm.settings import DecodeSettings

pytestmark = pytest.mark.filterwarnings("ignore:the prompt has")  # tiny-random-llada lacks the task words


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random-llada")


def count(model, mode: str, monkeypatch, stream: bool = True) -> DispatchCounter:
    counter = DispatchCounter(model)
    run = Scheduler._loop

    def counted(engine) -> None:
        with counter:  # the modes are the loop thread's: it runs every decode and forward
            run(engine)

    monkeypatch.setattr(Scheduler, "_loop", counted)
    engine = DiffusionBackend(model, name="m", mode=mode, max_running=16)
    try:
        with engine._cond:  # all queued at once
            jobs = [engine.submit(JobRequest(engine.encode_prompt(r.prompt), r.max_tokens,
                                             DecodeSettings(sampler=r.sampler, cache=r.cache), stream=stream))
                    for r in stress_requests(32)]
        assert all(isinstance(job.result(120), Done) for job in jobs)
    finally:
        engine.close()
    return counter


def outside(counter: DispatchCounter) -> tuple[int, int, int]:
    """(forward calls, ATen calls outside forwards, host syncs outside forwards)."""
    c = counter.current
    return c.forward_calls, c.layer_aten + c.outside_aten - c.forward_aten, len(c.syncs) - c.syncs_in_forward


def test_continuous_costs_no_more_outside_forwards_than_static(model, monkeypatch):
    cont_calls, cont_aten, cont_syncs = outside(count(model, "continuous", monkeypatch))
    stat_calls, stat_aten, stat_syncs = outside(count(model, "static", monkeypatch))
    assert cont_calls < stat_calls  # continuous merged the decodes' forwards ...
    assert cont_aten <= 1.2 * stat_aten  # ... at no more scheduler, sampler and engine work
    assert cont_syncs <= stat_syncs


@pytest.mark.parametrize("mode", ["continuous", "static", "serial"])
def test_one_canvas_read_per_decode_step(model, mode, monkeypatch):
    counter = count(model, mode, monkeypatch)
    sites = DispatchCounter.sync_sites([counter.current])
    mine = [n for site, n in sites.items() if "serve/backends/diffusion.py" in site]
    # streamed: the step callback's one read of the canvas, and one read of the answers per decode
    assert len(mine) == 2, sites
    assert not any("samplers/" in site or "engine.py" in site for site in sites), sites


def test_unstreamed_requests_read_nothing_per_step(model, monkeypatch):
    """No stream, stop strings or step events: the callback reads nothing; one read per decode."""
    streamed = outside(count(model, "continuous", monkeypatch, stream=True))
    plain = count(model, "continuous", monkeypatch, stream=False)
    sites = DispatchCounter.sync_sites([plain.current])
    assert len([s for s in sites if "serve/backends/diffusion.py" in s]) == 1, sites
    assert outside(plain)[2] < streamed[2]
