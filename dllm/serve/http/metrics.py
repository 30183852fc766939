"""Prometheus metrics of one app, in a registry of its own (two apps in one process never share counts).

Per request (observed from its ``Done``): time to first token, time per output token, end-to-end
latency, queue time, NFE per token, tokens per forward, acceptance length (speculative). Read from the
backend at scrape time (``BackendCollector``): queue depth, running batch, model forwards and the rows
they carried. Names follow vLLM's (vllm/engine/metrics.py: ``vllm:time_to_first_token_seconds`` ...)
under the ``dllm_`` prefix.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dllm.serve.backends.base import Backend
from dllm.serve.backends.jobs import Done

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_RATIO = (0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0)


class BackendCollector(Collector):
    """The backend's live numbers, read once per scrape from ``backend.stats()``."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        s = self.backend.stats()
        yield GaugeMetricFamily("dllm_queue_depth", "requests submitted and not started", value=s.queued)
        yield GaugeMetricFamily("dllm_running_batch", "requests decoding now", value=s.running)
        yield GaugeMetricFamily("dllm_max_running", "the bound on requests decoding at once", value=s.max_running)
        yield GaugeMetricFamily("dllm_max_queue", "the bound on waiting requests", value=s.max_queue)
        yield CounterMetricFamily("dllm_model_forwards", "model forwards run (a batched forward counts once)",
                                  value=s.forwards)
        yield CounterMetricFamily("dllm_forwarded_rows", "rows summed over the model forwards (/ forwards = "
                                                         "the mean batch)", value=s.forwarded_rows)
        yield GaugeMetricFamily("dllm_engine_closed", "1 once the backend refuses new requests", value=int(s.closed))


class Metrics:
    """The app's metrics; ``render()`` is the /metrics body."""

    def __init__(self, backend: Backend) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("dllm_requests", "HTTP requests by endpoint and status", ("endpoint", "status"),
                                registry=r)
        self.prompt_tokens = Counter("dllm_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.completion_tokens = Counter("dllm_generation_tokens", "generated tokens of finished requests",
                                         registry=r)
        self.finished = Counter("dllm_request_success", "finished choices (n a prompt) by finish reason",
                                ("finish_reason",), registry=r)
        self.ttft = Histogram("dllm_time_to_first_token_seconds", "submitted -> first final text", buckets=_SECONDS,
                              registry=r)
        self.tpot = Histogram("dllm_time_per_output_token_seconds", "(end - first token) / (tokens - 1)",
                              buckets=_PER_TOKEN, registry=r)
        self.e2e = Histogram("dllm_e2e_request_latency_seconds", "submitted -> done", buckets=_SECONDS, registry=r)
        self.queue_time = Histogram("dllm_request_queue_time_seconds", "submitted -> started", buckets=_SECONDS,
                                    registry=r)
        self.nfe_per_token = Histogram("dllm_nfe_per_token", "model forwards per generated token", buckets=_RATIO,
                                       registry=r)
        self.tokens_per_forward = Histogram("dllm_tokens_per_forward", "generated tokens per model forward",
                                            buckets=_RATIO, registry=r)
        self.acceptance = Histogram("dllm_acceptance_length", "speculative: tokens per verification round "
                                                              "(accepted + bonus)", buckets=_RATIO, registry=r)
        r.register(BackendCollector(backend))

    def count(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def observe(self, done: Done, first_choice: bool = True) -> None:
        """One finished choice; its prompt's tokens are counted with its prompt's first choice only (as the
        reply's ``usage`` counts them: once a prompt, whatever ``n``)."""
        if first_choice:
            self.prompt_tokens.inc(done.prompt_tokens)
        self.completion_tokens.inc(done.completion_tokens)
        self.finished.labels(finish_reason=done.finish_reason).inc()
        self.e2e.observe(done.wall_s)
        self.queue_time.observe(done.queue_s)
        if done.ttft_s is not None:
            self.ttft.observe(done.ttft_s)
            if done.completion_tokens > 1:
                self.tpot.observe(max(done.wall_s - done.ttft_s, 0.0) / (done.completion_tokens - 1))
        if done.completion_tokens and done.nfe:
            self.nfe_per_token.observe(done.nfe / done.completion_tokens)
            self.tokens_per_forward.observe(done.tokens_per_forward)
        if done.acceptance is not None:
            self.acceptance.observe(done.acceptance)

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "BackendCollector", "Metrics"]
