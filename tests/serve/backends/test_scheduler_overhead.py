"""The step loop's own work, counted on its thread with a dispatch-mode counter (what a GPU's host
would issue): continuous batching spends no more ATen calls and host syncs outside the model's
forwards than static batching for the same requests, per request and (within 1.2x) per forward call, the running decodes' step reads are one copy
per round of the loop, and a forward call costs at most two host syncs outside the model."""

from __future__ import annotations

import pytest

from dllm.eval.bench.counters import DispatchCounter, count_backend
from dllm.eval.bench.serving.serve import stress_requests
from dllm.scoring.exact_match import load_model

pytestmark = pytest.mark.filterwarnings("ignore:the prompt has")  # tiny-random-llada lacks the task words


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random-llada")


PLAIN, CACHED, LOPA = ("low_confidence", "none"), ("threshold", "dual"), ("fast", "auto")  # (sampler, cache)


def count(model, mode: str, stream: bool = True, join: bool = True, setting=PLAIN) -> DispatchCounter:
    """32 requests queued at once, every one finished (``count_backend`` raises otherwise)."""
    return count_backend(model, mode, stress_requests(32, settings=(setting,)), stream=stream, max_running=16,
                         join=join)


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


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("setting", [PLAIN, CACHED, LOPA])
def test_a_forward_call_of_continuous_costs_at_most_1_2x_static(model, stream, setting):
    """Issue 45's bar, per forward call: the running decode's one sampler step and commit for all of its
    rows (dllm.engine.running; under a cache, its calls of full and cached rows) against static
    batching's one generate step per batch."""
    cont_calls, cont_aten, _ = outside(count(model, "continuous", stream=stream, setting=setting))
    stat_calls, stat_aten, _ = outside(count(model, "static", stream=stream, setting=setting))
    assert cont_aten / cont_calls <= 1.2 * stat_aten / stat_calls, (cont_aten / cont_calls, stat_aten / stat_calls)


@pytest.mark.parametrize("mode", ["continuous", "static", "serial"])
def test_the_decodes_step_reads_are_one_copy_per_round(model, mode):
    counter = count(model, mode)
    sites = DispatchCounter.sync_sites([counter.current])
    reads = sum(n for site, n in sites.items() if "serve/backends/scheduling/batcher.py" in site)
    # streamed: every running decode's canvas read of a step joins one copy (Scheduler.read ->
    # batcher.read_together); a round of the loop reads after forwards, so there are no more read
    # copies than forward calls
    assert 0 < reads <= counter.current.forward_calls, sites
    assert not any("serve/backends/diffusion.py" in site for site in sites), sites  # answers: generate's read
    assert not any("samplers/" in site or "engine.py" in site for site in sites), sites


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("setting", [PLAIN, CACHED, LOPA])
def test_at_most_two_syncs_outside_forwards_per_forward_call(model, stream, setting):
    counter = count(model, "continuous", stream=stream, setting=setting)
    calls, _, syncs = outside(counter)
    # a merged call's packed tokens (dllm/models/core/views/packed.py) read their count on a CPU only,
    # where that read waits for nothing: not a host sync of the loop (on a GPU the batch stays padded)
    packing = sum(n for site, n in DispatchCounter.sync_sites([counter.current]).items()
                  if "models/core/views/packed.py" in site)
    assert packing <= calls and syncs - packing <= 2 * calls, (syncs, packing, calls)


def test_unstreamed_requests_of_generate_calls_read_nothing_per_step(model):
    """No stream, stop strings or step events, a generate call per group (``join=False``): the callback
    reads nothing; generate's own reads only."""
    streamed = outside(count(model, "continuous", stream=True, join=False))
    plain = count(model, "continuous", stream=False, join=False)
    sites = DispatchCounter.sync_sites([plain.current])
    assert not any("serve/backends/" in s for s in sites), sites
    assert outside(plain)[2] < streamed[2]


def test_unstreamed_requests_of_a_running_decode_are_read_where_rows_end(model):
    """The same requests joining one running decode (the default): its answers are read only at a step
    where a row ends, never more than once per request; streamed, every step."""
    def reads(counter: DispatchCounter) -> int:
        return sum(n for site, n in DispatchCounter.sync_sites([counter.current]).items() if "tolist" in site)

    streamed, plain = count(model, "continuous", stream=True), count(model, "continuous", stream=False)
    assert 0 < reads(plain) < reads(streamed)
    assert reads(plain) <= 32
    assert outside(plain)[2] < outside(streamed)[2]
    assert outside(plain)[1] < outside(count(model, "continuous", stream=False, join=False))[1]
