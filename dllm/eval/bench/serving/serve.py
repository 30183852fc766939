"""``dllm bench serve``: a load generator against ``dllm serve``, in the manner of vLLM's serving benchmark.

    dllm bench serve --model tiny-llada --n 128 --rates 8 inf --modes continuous static serial \\
        --repeats 3 --threads 1 --out runs/serve

For each serving mode (``continuous``: requests join and leave the running batch at every step;
``static``: a batch is formed from the queue and runs until its last row ends; ``serial``: one request
at a time) the bench starts a server, the real app (``dllm.serve.http.app.create_app``) on a
``DiffusionBackend`` in that mode, on 127.0.0.1: ``dllm serve --mode MODE`` in its own process
(``--server process``, the default; the load generator then shares no interpreter lock with the
server) or a thread of this one (``--server thread``; ``dllm.eval.bench.serving.servers``). Every server is up
before the first row, and the rows interleave: for each repeat, for each rate, each mode in turn, so
that a machine whose load drifts slows every mode alike. A row sends the same N requests built from
the stress tasks (``dllm.tasks.test_split``: mixed prompt and answer lengths, ``max_tokens`` = the
task's answer length; ``--settings`` in turn: sampler and cache per request) with Poisson arrivals at
the rate (exponential gaps of mean 1/rate; ``inf`` sends them all at once), streaming, over loopback.
A row is bounded in count (N) and in time (``--max-seconds``: no request is sent after it;
``--request-timeout`` per request). It measures completed and failed requests, requests/s and output
tokens/s (over the time from the first request sent to the last one finished), time to first token
(the first non-empty text delta) and end-to-end latency, p50 and p99, and the mean batch (rows per
model forward, from the server's /metrics). The table shows each (mode, rate)'s medians over
``--repeats``, then the verdict (continuous against serial and static at each rate: the ratio of
requests/s and of p99 latency); ``serve.json`` keeps every row and ``serve.png`` draws the table.
Ctrl-C keeps the finished rows (written after each).

vLLM's benchmark: benchmarks/benchmark_serving.py (vllm-project/vllm); continuous batching: Orca,
Yu et al., OSDI 2022.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from dllm.flags import POSITIVE, output_dir
from dllm.eval.bench.serving.serve_table import MODES, format_table, median_rows, percentile, plot, verdict_line, verdicts
from dllm.eval.interrupt import finished, until_interrupted


@dataclass(frozen=True)
class BenchRequest:
    """One request of the load: a stress-task prompt, its answer length and how it decodes."""

    task: str
    prompt: str
    max_tokens: int
    sampler: str = "low_confidence"
    cache: str = "none"

    def body(self) -> dict:
        return {"prompt": self.prompt, "max_tokens": self.max_tokens, "sampler": self.sampler, "cache": self.cache}


@dataclass(frozen=True)
class Outcome:
    """What one request measured (seconds from the moment it was sent)."""

    ok: bool
    ttft_s: Optional[float] = None  # first non-empty text delta
    latency_s: float = 0.0  # sent -> the stream's end
    output_tokens: Optional[int] = 0  # the reply's usage.completion_tokens (None: the server sent no usage)
    error: str = ""


def stress_requests(n: int, tasks: Optional[Sequence[str]] = None, seed: int = 0,
                    settings: Sequence[tuple[str, str]] = (("low_confidence", "none"),)) -> list[BenchRequest]:
    """``n`` requests drawn (with ``seed``) from the test split of ``tasks`` (default: the pb-mini
    suite), every default size: mixed prompt and answer lengths; request i decodes with
    ``settings[i % len(settings)]`` (sampler spec, cache spec)."""
    from dllm import tasks as T

    names = tuple(tasks) if tasks else T.suite_task_names()
    pool = [(name, " ".join(T.prompt_words(ex)), T.answer_length(name, ex.size))
            for name in names for ex in T.test_split(name, n=4)]
    rng = random.Random(seed)
    return [BenchRequest(*rng.choice(pool), *settings[i % len(settings)]) for i in range(n)]


def parse_setting(text: str) -> tuple[str, str]:
    """``--settings`` item: ``SAMPLER[@CACHE]`` (``threshold:threshold=0.8@dual``; cache default none)."""
    sampler, _, cache = text.partition("@")
    if not sampler or (_ and not cache):
        raise argparse.ArgumentTypeError(f"a setting is SAMPLER[@CACHE] (threshold@dual), got {text!r}")
    return sampler, cache or "none"


def arrival_times(n: int, rate: float, seed: int = 0) -> list[float]:
    """Send times (s from the start) of ``n`` Poisson arrivals at ``rate`` requests/s: cumulative
    exponential gaps of mean 1/rate; ``rate`` = inf sends every request at 0."""
    if not rate > 0:
        raise ValueError(f"a request rate must be > 0 requests/s (or inf), got {rate}")
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def _send(session, url: str, model: str, req: BenchRequest, extra: dict, timeout: float,
                count_tokens: Optional[Callable[[str], int]]) -> Outcome:
    import aiohttp

    body = {"model": model, **req.body(), "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    start = time.perf_counter()
    ttft, text, usage = None, [], None
    try:
        async with session.post(url + "/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as reply:
            if reply.status != 200:
                return Outcome(False, latency_s=time.perf_counter() - start,
                               error=f"HTTP {reply.status}: {(await reply.text())[:200]}")
            async for raw in reply.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    return Outcome(False, latency_s=time.perf_counter() - start, error=str(chunk["error"])[:200])
                usage = chunk.get("usage") or usage
                piece = chunk["choices"][0].get("text", "") if chunk.get("choices") else ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - start
                text.append(piece)
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        return Outcome(False, latency_s=time.perf_counter() - start, error=f"{type(err).__name__}: {err}"[:200])
    tokens = usage["completion_tokens"] if usage else (count_tokens("".join(text)) if count_tokens else None)
    return Outcome(True, ttft, time.perf_counter() - start, tokens)


async def run_load(url: str, model: str, requests: Sequence[BenchRequest], rate: float, *, extra: dict,
                   max_seconds: float, request_timeout: float, count_tokens: Optional[Callable[[str], int]],
                   seed: int = 0, progress: Optional[Callable[[], None]] = None) -> tuple[list[Outcome], float]:
    """Send ``requests`` at Poisson ``rate`` (none after ``max_seconds``); their outcomes in order of
    the list (requests never sent are left out) and the seconds from the first send to the last end."""
    import aiohttp

    times = arrival_times(len(requests), rate, seed)
    start = time.perf_counter()
    ends: list[float] = []

    async def one(req: BenchRequest, at: float) -> Optional[Outcome]:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
        if time.perf_counter() - start > max_seconds:
            return None
        outcome = await _send(session, url, model, req, extra, request_timeout, count_tokens)
        ends.append(time.perf_counter())
        if progress:
            progress()
        return outcome

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        outcomes = await asyncio.gather(*(one(r, t) for r, t in zip(requests, times)))
    duration = (max(ends) - start) if ends else 0.0
    return [o for o in outcomes if o is not None], duration


def summarize(mode: str, rate: float, outcomes: Sequence[Outcome], duration: float,
              mean_batch: Optional[float] = None) -> dict:
    """One table row of a (mode, rate) run."""
    ok = [o for o in outcomes if o.ok]
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
    lat = [o.latency_s for o in ok]
    r = lambda x, d=4: None if x is None else round(x, d)  # noqa: E731
    row = {"mode": mode, "rate": "inf" if math.isinf(rate) else rate, "completed": len(ok),
           "failed": len(outcomes) - len(ok), "duration_s": r(duration, 3),
           "requests_per_s": r(len(ok) / duration if duration > 0 else 0.0, 3),
           "output_tokens_per_s": None if any(o.output_tokens is None for o in ok) else
           r(sum(o.output_tokens for o in ok) / duration if duration > 0 else 0.0, 2),
           "ttft_p50_s": r(percentile(ttfts, 50)), "ttft_p99_s": r(percentile(ttfts, 99)),
           "e2e_p50_s": r(percentile(lat, 50)), "e2e_p99_s": r(percentile(lat, 99)),
           "mean_batch": r(mean_batch, 2)}
    errors = sorted({o.error for o in outcomes if not o.ok})
    if errors:
        row["errors"] = errors[:5]
    return row


def write(out: Path, meta: dict, rows: list[dict], *, with_plot: bool = True) -> None:
    """serve.json of the rows so far and, ``with_plot``, serve.png (a plot costs about 0.5 s: drawn once
    the rows are done, or kept on Ctrl-C)."""
    out.mkdir(parents=True, exist_ok=True)
    table = median_rows(rows)
    (out / "serve.json").write_text(json.dumps({**meta, "rows": rows, "table": table, "verdicts": verdicts(table)},
                                               indent=2))
    if rows and with_plot:
        plot(table, out / "serve.png")


def parse_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a rate is a number of requests/s or inf, got {text!r}") from None
    if not rate > 0:
        raise argparse.ArgumentTypeError(f"a rate must be > 0 requests/s (or inf), got {text!r}")
    return rate


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dllm bench serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-llada", help="a diffusion model name or directory")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--rates", nargs="+", type=parse_rate, default=[math.inf], metavar="RATE",
                    help="Poisson arrival rates in requests/s (inf: all at once); one row per mode and rate")
    ap.add_argument("--n", type=POSITIVE, default=128, help="requests per (mode, rate)")
    ap.add_argument("--repeats", type=POSITIVE, default=1,
                    help="rounds over rates x modes, interleaved; the table shows each measure's median")
    ap.add_argument("--tasks", nargs="+", default=None, help="stress tasks the prompts come from (default: pb-mini)")
    ap.add_argument("--settings", nargs="+", type=parse_setting, default=[("low_confidence", "none")],
                    metavar="SAMPLER[@CACHE]", help="how the requests decode, in turn (threshold@dual: a sampler "
                                                    "spec, @, a cache spec; default low_confidence@none)")
    ap.add_argument("--block-length", type=POSITIVE, default=None)
    ap.add_argument("--max-running", type=POSITIVE, default=32, help="rows in the running batch at most")
    ap.add_argument("--max-batch-tokens", type=POSITIVE, default=None,
                    help="continuous mode: rows x padded length of one merged forward (default: the server's)")
    ap.add_argument("--server", choices=("process", "thread"), default="process",
                    help="where each mode's server runs: its own process (the load generator does not share "
                         "an interpreter lock with it) or a thread of the bench's process")
    ap.add_argument("--startup-timeout", type=float, default=300.0, help="seconds a server may take to start")
    ap.add_argument("--max-seconds", type=float, default=300.0, help="no request is sent after this many seconds")
    ap.add_argument("--request-timeout", type=float, default=300.0, help="seconds one request may take")
    ap.add_argument("--seed", type=int, default=0, help="the draw of the requests and of the arrival gaps")
    ap.add_argument("--threads", type=POSITIVE, default=None, help="torch CPU threads")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", type=output_dir, default="runs/serve", help="folder of serve.json and serve.png")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def machine(args: argparse.Namespace) -> dict:
    """Where the numbers come from: CPUs, torch threads, device, and the load average at the start
    (a busy machine slows every mode, not equally)."""
    import os
    import platform

    return {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads,
            "device": args.device or "dllm.load's default", "load_average_1m": round(os.getloadavg()[0], 2)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    for flag in ("max_seconds", "request_timeout", "startup_timeout"):
        if not getattr(args, flag) > 0:
            ap.error(f"--{flag.replace('_', '-')} must be > 0 seconds, got {getattr(args, flag)}")
    from dllm import tasks as T

    unknown = [t for t in args.tasks or () if t not in dict(T.list_tasks())]
    if unknown:
        ap.error(f"unknown task(s) {unknown}; valid: {sorted(dict(T.list_tasks()))}")
    from dllm.cache import make_cache
    from dllm.samplers import make_sampler

    for sampler, cache in args.settings:  # refused here, not as 128 failed requests per row
        try:
            make_sampler(sampler)
            make_cache(cache)
        except (ValueError, TypeError, KeyError) as err:
            ap.error(f"--settings {sampler}@{cache}: {err}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from dllm.models.loading import ModelNotFoundError, load, locate, resolve_device

    try:  # here, not as a server process that exits at its start
        locate(args.model)
        resolve_device(args.device)
    except (ModelNotFoundError, ValueError) as err:
        ap.error(f"--model {args.model!r}: {err}" if isinstance(err, ModelNotFoundError) else str(err))
    # the thread servers share one model; a process server loads its own
    model = load(args.model, device=args.device) if args.server == "thread" else None
    requests = stress_requests(args.n, args.tasks, args.seed, args.settings)
    extra = {}
    if args.block_length:
        extra["block_length"] = args.block_length
    out = Path(args.out)
    meta = {"model": args.model, "n": args.n, "tasks": args.tasks or "pb-mini",
            "settings": ["@".join(s) for s in args.settings], "block_length": args.block_length,
            "max_running": args.max_running, "max_batch_tokens": args.max_batch_tokens, "server": args.server,
            "seed": args.seed, "repeats": args.repeats,
            "machine": machine(args),
            "argv": list(argv) if argv is not None else None}
    rows: list[dict] = []

    def body() -> int:
        with open_servers(model, requests, extra, args) as urls:
            for repeat in range(args.repeats):  # interleaved: a load that drifts hits every mode alike
                for rate in args.rates:
                    for mode in args.modes:
                        row = bench_row(urls[mode], args.model, mode, requests, rate, extra=extra, args=args,
                                        count_tokens=token_counter(model))
                        rows.append({**row, "repeat": repeat})
                        write(out, meta, rows, with_plot=False)
        write(out, meta, rows)
        table = median_rows(rows)
        print(format_table(table))
        for v in verdicts(table):
            print(verdict_line(v))
        print(f"wrote {out / 'serve.json'} and {out / 'serve.png'}")
        return 0

    def kept() -> str:
        if not rows:
            return "no row had finished; nothing was written"
        print(format_table(median_rows(rows)))
        write(out, meta, rows)
        return finished(len(rows), "row", str(out / "serve.json"))

    return until_interrupted(body, kept)


def token_counter(model) -> Optional[Callable[[str], int]]:
    """Tokens of a reply's text (when the server sends no usage): the model's tokenizer, if loaded here."""
    tok = getattr(model, "tokenizer", None) if model is not None else None
    if tok is None:
        return None
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])


@contextmanager
def open_servers(model, requests: Sequence[BenchRequest], extra: dict, args: argparse.Namespace) -> Iterator[dict]:
    """Every mode's server (``dllm.eval.bench.serving.servers.mode_servers``), each warmed by two requests:
    {mode: url}; all stopped on exit."""
    from dllm.eval.bench.serving.servers import mode_servers

    with mode_servers(model, args.model, args.modes, max_queue=max(256, 2 * len(requests)), args=args) as urls:
        for url in urls.values():
            asyncio.run(run_load(url, args.model, requests[:2], math.inf, extra=extra,
                                 max_seconds=args.max_seconds, request_timeout=args.request_timeout,
                                 count_tokens=None))  # first forwards, threads started
        yield urls


def bench_row(url: str, name: str, mode: str, requests: Sequence[BenchRequest], rate: float, *, extra: dict,
              args: argparse.Namespace, count_tokens: Optional[Callable[[str], int]] = None) -> dict:
    """The requests at ``rate`` against the server at ``url``: one table row."""
    from tqdm import tqdm

    from dllm.eval.bench.serving.servers import forward_counts

    before = forward_counts(url)
    with tqdm(total=len(requests), desc=f"bench serve {mode} @ {rate}/s", unit="req", disable=args.no_progress) as bar:
        outcomes, duration = asyncio.run(run_load(url, name, requests, rate, extra=extra, seed=args.seed,
                                                  max_seconds=args.max_seconds, request_timeout=args.request_timeout,
                                                  count_tokens=count_tokens, progress=lambda: bar.update(1)))
    after = forward_counts(url)
    batch = None
    if before and after and after[0] > before[0]:
        batch = (after[1] - before[1]) / (after[0] - before[0])
    return summarize(mode, rate, outcomes, duration, batch)


if __name__ == "__main__":
    raise SystemExit(main())
