"""Where a serving mode's time goes, without HTTP: the engine driven directly, model forwards timed.

    python benchmarks/serve_engine.py [MODEL] [--n 128] [--repeats 3] [--settings low_confidence@none ...]

``dllm bench serve``'s requests (the same draw of stress-task prompts, ``max_tokens`` = the answer
length), all queued at once on a ``DiffusionEngine`` of each mode (continuous, static, serial) in
interleaved rounds; torch forward hooks on the model time every forward and count the tokens it
computed (rows x columns) and the real ones among them (the key-padding mask). Prints per mode the
median requests/s, the share of the wall time spent in forwards, forward calls, forwarded tokens
(padded and real) and the microseconds per forwarded token. Where every mode forwards about the
same tokens and forwards fill the wall time, no scheduling makes one mode much faster than another:
the forward's cost per token bounds them all.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dllm.eval.bench.serve import parse_setting, stress_requests
from dllm.scoring.exact_match import load_model
from dllm.serve.engines.batcher import BatcherConfig
from dllm.serve.engines.diffusion import MODES, DiffusionEngine
from dllm.serve.engines.jobs import DiffusionSettings, JobRequest


class ForwardMeter:
    """Torch forward hooks on the model: time in forwards, calls, tokens computed, real tokens."""

    def __init__(self, model) -> None:
        self.seconds, self.calls, self.tokens, self.real = 0.0, 0, 0, 0
        self._t0 = 0.0
        model.register_forward_pre_hook(self._pre, with_kwargs=True)
        model.register_forward_hook(self._post)

    def _pre(self, module, args, kwargs) -> None:
        x = args[0] if args else kwargs["input_ids"]  # [R, T]
        kpm = kwargs.get("key_padding_mask")  # [R, T] on a plain forward, or None
        self.calls += 1
        self.tokens += x.numel()
        self.real += int(kpm.sum()) if kpm is not None and kpm.shape == x.shape else x.numel()
        self._t0 = time.perf_counter()

    def _post(self, module, args, output) -> None:
        self.seconds += time.perf_counter() - self._t0


def run_mode(model, meter: ForwardMeter, mode: str, requests, args) -> dict:
    engine = DiffusionEngine(model, name=args.model, mode=mode, max_running=args.max_running,
                             batcher=BatcherConfig(max_tokens=args.max_batch_tokens))
    try:
        prompts = [engine.encode_prompt(r.prompt) for r in requests]
        before = (meter.seconds, meter.calls, meter.tokens, meter.real)
        t0 = time.perf_counter()
        with engine._cond:  # queue every request before the engine takes any: the load at rate inf
            jobs = [engine.submit(JobRequest(p, r.max_tokens, DiffusionSettings(sampler=r.sampler, cache=r.cache)))
                    for p, r in zip(prompts, requests)]
        for job in jobs:
            job.result(timeout=args.request_timeout)
        wall = time.perf_counter() - t0
    finally:
        engine.close()
    seconds, calls, tokens, real = (now - then for now, then in
                                    zip((meter.seconds, meter.calls, meter.tokens, meter.real), before))
    return {"rps": len(requests) / wall, "share": seconds / wall, "calls": calls, "tokens": tokens,
            "real": real, "us_per_token": 1e6 * seconds / tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="tiny-llada")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", nargs="+", type=parse_setting, default=[("low_confidence", "none")])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--max-running", type=int, default=32)
    ap.add_argument("--max-batch-tokens", type=int, default=768)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    meter = ForwardMeter(model)
    requests = stress_requests(args.n, settings=args.settings)
    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    for _ in range(args.repeats):  # interleaved: a drifting machine slows every mode alike
        for mode in args.modes:
            runs[mode].append(run_mode(model, meter, mode, requests, args))
    print(f"{args.model}, {args.n} requests at once, settings {' '.join(s + '@' + c for s, c in args.settings)}, "
          f"{args.threads} thread(s), no HTTP; median of {args.repeats} interleaved rounds")
    print(f"{'mode':<12}{'req/s':>8}{'forward share':>15}{'calls':>8}{'tokens':>9}{'real':>9}{'us/token':>10}")
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    for mode, r in med.items():
        print(f"{mode:<12}{r['rps']:>8.1f}{r['share']:>15.2f}{r['calls']:>8.0f}{r['tokens']:>9.0f}"
              f"{r['real']:>9.0f}{r['us_per_token']:>10.1f}")
    if "continuous" in med:
        for other in (m for m in med if m != "continuous"):
            print(f"continuous / {other}: x{med['continuous']['rps'] / med[other]['rps']:.2f} requests/s, "
                  f"x{med['continuous']['tokens'] / med[other]['tokens']:.2f} forwarded tokens")


if __name__ == "__main__":
    main()
