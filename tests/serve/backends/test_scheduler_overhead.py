"""The step loop's own work, counted on its thread with a dispatch-mode counter (what a GPU's host
would issue): continuous batching spends no more ATen calls and host syncs outside the model's
forwards than static batching for the same requests, and no mode reads the canvas back more than
once per decode step."""

from __future__ import annotations

import pytest

from dllm.eval.bench.counters import DispatchCounter, count_backend
from dllm.eval.bench.serving.serve import stress_requests
from dllm.scoring.exact_match import load_model

pytestmark = pytest.mark.filterwarnings("ignore:the prompt has")  # tiny-random-llada lacks the task words


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random-llada")


def count(model, mode: str, stream: bool = True) -> DispatchCounter:
    """32 requests queued at once, every one finished (``count_backend`` raises otherwise)."""
    return count_backend(model, mode, stress_requests(32), stream=stream, max_running=16)


def outside(counter: DispatchCounter) -> tuple[int, int, int]:
    """(forward calls, ATen calls outside forwards, host syncs outside forwards)."""
    c = counter.current
    return c.forward_calls, c.aten_outside_forwards, c.syncs_outside_forwards


def test_continuous_costs_no_more_outside_forwards_than_static(model):
    cont_calls, cont_aten, cont_syncs = outside(count(model, "continuous"))
    stat_calls, stat_aten, stat_syncs = outside(count(model, "static"))
    assert cont_calls < stat_calls  # continuous merged the decodes' forwards ...
    assert cont_aten <= 1.2 * stat_aten  # ... at no more scheduler, sampler and engine work
    assert cont_syncs <= stat_syncs


@pytest.mark.parametrize("mode", ["continuous", "static", "serial"])
def test_one_canvas_read_per_decode_step(model, mode):
    counter = count(model, mode)
    sites = DispatchCounter.sync_sites([counter.current])
    mine = [n for site, n in sites.items() if "serve/backends/diffusion.py" in site]
    # streamed: the step callback's one read of the canvas, and one read of the answers per decode
    assert len(mine) == 2, sites
    assert not any("samplers/" in site or "engine.py" in site for site in sites), sites


def test_unstreamed_requests_read_nothing_per_step(model):
    """No stream, stop strings or step events: the callback reads nothing; one read per decode."""
    streamed = outside(count(model, "continuous", stream=True))
    plain = count(model, "continuous", stream=False)
    sites = DispatchCounter.sync_sites([plain.current])
    assert len([s for s in sites if "serve/backends/diffusion.py" in s]) == 1, sites
    assert outside(plain)[2] < streamed[2]
