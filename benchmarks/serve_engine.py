"""Where a serving mode's time goes, without HTTP: the backend driven directly, model forwards timed.

    python benchmarks/serve_engine.py [MODEL] [--null-model] [--n 128] [--repeats 3] [--settings low_confidence@none ...]

``dllm bench serve``'s requests (the same draw of stress-task prompts, ``max_tokens`` = the answer
length), all queued at once on a ``DiffusionBackend`` of each mode (continuous, ``cont-nojoin``:
continuous with ``join=False``, static, serial; ``cont-padded`` on request: continuous with the
model's padded forward) in interleaved rounds; torch forward hooks on the model time every forward and count the rows and
tokens it computed (and the real ones among them: the key-padding mask). Prints per mode the median
requests/s, the share of the wall time spent in forwards, forward calls, forwarded tokens (padded
and real), microseconds per forwarded token, and the scheduler's own microseconds per running row
per step (wall time outside forwards / rows forwarded: every running row is forwarded once a step).

``--null-model`` serves MODEL's tokenizer and settings with a forward that returns fixed logits at
almost no cost (``NullModel``): what a GPU, where a small forward is nearly free, looks like to the
scheduler, so the table shows the scheduler's own overhead. Requests then all run to ``max_tokens``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Optional

import torch

from dllm.cli.args import call_cost_tokens
from dllm.eval.bench.serving.serve import parse_setting, stress_requests
from dllm.models.inputs import ModelOutput
from dllm.scoring.exact_match import load_model
from dllm.serve.backends.scheduling.batcher import BatcherConfig
from dllm.serve.backends.diffusion import MODES, DiffusionBackend
from dllm.serve.backends.jobs import JobRequest
from dllm.settings import DecodeSettings


class NullModel(torch.nn.Module):
    """``model``'s attributes (tokenizer, ids, limits) with a forward of fixed logits: token
    ``token`` most likely everywhere, a few others behind it. Plain forwards only (serve with
    ``cache=none``); logits are a fresh tensor each call (samplers may write into theirs)."""

    packs_padded_rows = False  # its forward packs nothing: the merge plan counts padded tokens, as before

    def __init__(self, model, token: int) -> None:
        super().__init__()
        self.__dict__["inner"] = model  # not a submodule: its parameters are not this model's
        v = int(model.config.vocab_size)
        row = torch.linspace(0.0, -4.0, v)
        row[token] = 2.0
        weight = next(model.parameters())
        self.register_buffer("row", row.to(device=weight.device, dtype=weight.dtype))  # on the model's device

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["inner"], name)

    def forward(self, input_ids: torch.Tensor, *, logits_rows: Optional[tuple[int, int]] = None,
                cache: Any = None, **kwargs: Any) -> ModelOutput:
        if cache is not None:
            raise ValueError("NullModel serves plain forwards only (cache=none)")
        b, t = input_ids.shape
        lo, hi = logits_rows if logits_rows is not None else (0, t)
        return ModelOutput(self.row.expand(b, hi - lo, -1).clone())  # [B, hi - lo, V]


class ForwardMeter:
    """Torch forward hooks on the model: time in forwards, calls, rows and tokens computed, real tokens.
    On CUDA each hook synchronises the device first, so a forward's time is its kernels' too, not only
    their launches (and the scheduler's time is not charged with them)."""

    def __init__(self, model) -> None:
        self.seconds, self.calls, self.rows, self.tokens, self.real = 0.0, 0, 0, 0, 0
        self._t0 = 0.0
        device = torch.device(model.device)  # a NullModel's is its inner model's
        self._cuda = device if device.type == "cuda" else None
        model.register_forward_pre_hook(self._pre, with_kwargs=True)
        model.register_forward_hook(self._post)

    def totals(self) -> tuple:
        return self.seconds, self.calls, self.rows, self.tokens, self.real

    def _pre(self, module, args, kwargs) -> None:
        x = args[0] if args else kwargs["input_ids"]  # [R, T]
        kpm = kwargs.get("key_padding_mask")  # [R, T] on a plain forward, or None
        self.calls += 1
        self.rows += x.shape[0]
        self.tokens += x.numel()
        self.real += int(kpm.sum()) if kpm is not None and kpm.shape == x.shape else x.numel()
        self._sync()
        self._t0 = time.perf_counter()

    def _post(self, module, args, output) -> None:
        self._sync()
        self.seconds += time.perf_counter() - self._t0

    def _sync(self) -> None:
        if self._cuda is not None and not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize(self._cuda)


NOJOIN = "cont-nojoin"  # continuous with join=False: a generate call per group of requests
DEFAULT_MODES = [MODES[0], NOJOIN, *MODES[1:]]  # every mode but cont-padded: continuous first
PADDED = "cont-padded"  # continuous with the model's padded forward (packs_padded_rows = False): merged
#   calls of short rows forward their padding (dllm.models.core.views.packed), planned by padded length


def run_mode(model, meter: ForwardMeter, mode: str, requests, args) -> dict:
    if mode != PADDED:
        return _run_mode(model, meter, mode, requests, args)
    packs = model.packs_padded_rows
    model.packs_padded_rows = False
    try:
        return _run_mode(model, meter, "continuous", requests, args)
    finally:
        model.packs_padded_rows = packs


def _run_mode(model, meter: ForwardMeter, mode: str, requests, args) -> dict:
    engine = DiffusionBackend(model, name=args.model, mode="continuous" if mode == NOJOIN else mode,
                              max_running=args.max_running, join=mode != NOJOIN,
                              batcher=BatcherConfig(max_tokens=args.max_batch_tokens,
                                                    **({} if args.call_cost_tokens is None
                                                       else {"call_cost_tokens": args.call_cost_tokens})))
    call_cost = engine.batcher.call_cost_tokens  # measured here with --call-cost-tokens auto
    try:
        prompts = [engine.encode_prompt(r.prompt) for r in requests]
        with engine._cond:  # queue every request before the backend takes any: the load at rate inf
            jobs = [engine.submit(JobRequest(p, r.max_tokens, DecodeSettings(
                        sampler=r.sampler, cache=r.cache, temperature=args.temperature,
                        seed=i if args.temperature else None)))  # sampled: request i with seed i
                    for i, (p, r) in enumerate(zip(prompts, requests))]
            before = meter.totals()
            t0 = time.perf_counter()  # the backend starts once the lock is released
        for job in jobs:
            job.result(timeout=args.request_timeout)
        wall = time.perf_counter() - t0
    finally:
        engine.close()
    seconds, calls, rows, tokens, real = (now - then for now, then in zip(meter.totals(), before))
    return {"rps": len(requests) / wall, "share": seconds / wall, "calls": calls, "tokens": tokens,
            "real": real, "us_per_token": 1e6 * seconds / tokens, "us_per_row_step": 1e6 * (wall - seconds) / rows,
            "call_cost": call_cost}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="tiny-llada", help="a servable model (default tiny-llada)")
    ap.add_argument("--null-model", action="store_true", help="fixed logits at ~zero cost instead of the forward")
    ap.add_argument("--n", type=int, default=128, help="requests, all queued at once (default 128)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--settings", nargs="+", type=parse_setting, default=[("low_confidence", "none")],
                    help="SAMPLER[@CACHE] items, request i takes item i mod their number (default low_confidence@none)")
    ap.add_argument("--modes", nargs="+", choices=(*MODES, NOJOIN, PADDED), default=DEFAULT_MODES,
                    help=f"serving modes ({NOJOIN}: continuous with join=False; default: all)")
    ap.add_argument("--max-running", type=int, default=32, help="rows decoding at once (default 32)")
    ap.add_argument("--max-batch-tokens", type=int, default=768, help="tokens of one merged forward (default 768)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="every request's temperature (default 0; > 0: request i sampled with seed i)")
    ap.add_argument("--call-cost-tokens", type=call_cost_tokens, default=None,
                    help="one forward call's cost beyond its tokens, in tokens, or auto (measured for the model "
                         "at the backend's start, as dllm serve does); default: BatcherConfig's, 128")
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--device", default=None, help="the model's device (default: the loader's)")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model, device=args.device)
    if args.null_model:
        if any(cache != "none" for _, cache in args.settings):
            ap.error("--null-model serves plain forwards only: give settings with cache none")
        model = NullModel(model, token=5)  # an ordinary id: no special token, no EOS
    meter = ForwardMeter(model)
    requests = stress_requests(args.n, settings=args.settings)
    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    for _ in range(args.repeats):  # interleaved: a drifting machine slows every mode alike
        for mode in args.modes:
            runs[mode].append(run_mode(model, meter, mode, requests, args))
    costs = [r["call_cost"] for rs in runs.values() for r in rs]
    lines = [f"# python benchmarks/serve_engine.py {args.model}{' --null-model' if args.null_model else ''} "
             f"--n {args.n} --repeats {args.repeats} --settings {' '.join(s + '@' + c for s, c in args.settings)} "
             f"--max-running {args.max_running} --max-batch-tokens {args.max_batch_tokens} --threads {args.threads}"
             + (f" --call-cost-tokens {args.call_cost_tokens}" if args.call_cost_tokens is not None else "")
             + (f" --temperature {args.temperature:g}" if args.temperature else "")
             + (f" --device {args.device}" if args.device else "")
             + (f" --modes {' '.join(args.modes)}" if args.modes != DEFAULT_MODES else ""),
             f"# torch {torch.__version__}; all requests queued at once, no HTTP; median of {args.repeats} "
             f"interleaved rounds"
             + (f"; call cost measured at each backend's start: {min(costs)}-{max(costs)} tokens"
                if args.call_cost_tokens == "auto" else ""),
             f"{'mode':<12}{'req/s':>8}{'forward share':>15}{'calls':>8}{'tokens':>9}{'real':>9}{'us/token':>10}"
             f"{'sched us/row/step':>19}"]
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "call_cost"} for m, rs in runs.items()}
    for mode, r in med.items():
        lines.append(f"{mode:<12}{r['rps']:>8.1f}{r['share']:>15.2f}{r['calls']:>8.0f}{r['tokens']:>9.0f}"
                     f"{r['real']:>9.0f}{r['us_per_token']:>10.1f}{r['us_per_row_step']:>19.1f}")
    if "continuous" in med:
        for other in (m for m in med if m != "continuous"):
            lines.append(f"continuous / {other}: x{med['continuous']['rps'] / med[other]['rps']:.2f} requests/s, "
                         f"x{med['continuous']['tokens'] / med[other]['tokens']:.2f} forwarded tokens")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
