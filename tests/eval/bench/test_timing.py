"""``dllm.eval.bench.timing``: the one timer of the benchmarks."""

import torch

from dllm.eval.bench.timing import peak_memory_mb, reset_peak_memory, timed


def test_timed_warms_up_then_returns_the_median_call():
    calls = []

    def fn():
        calls.append(len(calls))
        return len(calls) - 1

    t = timed(fn, torch.device("cpu"), repeats=3, warmup=2)
    assert len(calls) == 5 and len(t.times) == 3
    assert t.seconds == sorted(t.times)[1]
    assert t.result == 2 + sorted(range(3), key=t.times.__getitem__)[1]  # what the median call returned
    assert timed(fn, torch.device("cpu"), repeats=0).times.__len__() == 1  # at least one timed call


def test_peak_memory_on_cpu_is_the_resident_set_or_none():
    cpu = torch.device("cpu")
    if reset_peak_memory(cpu):
        assert peak_memory_mb(cpu) > 1.0  # the interpreter and torch alone take more
