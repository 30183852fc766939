"""``attn_backend="auto"``: the attention backend measured fastest for each shape bucket.

``AutoAttention`` is an attention backend function (same signature as the others in
``dllm.kernels.attention``) that dispatches every call to a backend chosen by measurement:

- the first call of a **bucket** (``bucket_key``: device, dtype, batch, heads, kv heads, head dim,
  query length and key length rounded up to powers of two, mask kind, return_probs, whether
  autograd needs the output) **probes**: every candidate (``AutoConfig.candidates``) that does not
  refuse the request is called ``warmup`` times, then timed up to ``repeats`` times (device
  synchronised on both sides of every timed call, so launch overhead counts; at least one timed
  call, and no more once ``budget_ms`` of timed calls are spent); the fastest wins, except that the
  first eligible candidate is kept unless another beats it by more than ``keep_first_within``;
- every later call of the bucket is one tuple build, one dict lookup and the chosen function:
  no host sync, no timing;
- a candidate that refuses the request (``probe_refusal()``: not usable on this host;
  ``request_refusal(...)``: not for these tensors) is skipped and its reason recorded; one that
  raises ``RequestRefused`` while probed is skipped the same way, and so is one whose kernel fails
  to compile or launch on this device (a Triton ``TritonError``: a tile past the GPU's shared
  memory, say; ``probe_failures``);
- a request no candidate serves (``return_probs``, say) goes to the first of ``AutoConfig.fallback``
  that accepts it; so does a call whose chosen backend raises ``RequestRefused`` (a mask of the
  bucket's kind but of a form that backend cannot express).

Decisions are cached in memory for the life of the object (``decisions()``, ``reset()``); during a
CUDA graph capture nothing is probed (the fallback runs, nothing is cached).

Candidates are duck-typed: ``name``, ``fn``, ``probe_refusal() -> str | None`` and
``request_refusal(q, k, v, mask, return_probs, needs_grad) -> str | None``
(``dllm.kernels.attention.Backend``), looked up by name through ``lookup`` at probe time.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import torch


class RequestRefused(ValueError):
    """A backend cannot serve this call (e.g. a mask it cannot express); nothing was computed."""


def probe_failures() -> tuple[type[BaseException], ...]:
    """What a candidate may raise while probed to be skipped instead of failing the call:
    ``RequestRefused``, and Triton's compile/launch errors (``triton.errors.TritonError``:
    ``OutOfResources``, ``CompilationError``) where Triton is installed."""
    try:
        from triton.errors import TritonError
    except ImportError:  # no triton (or one without the common base): only refusals
        return (RequestRefused,)
    return (RequestRefused, TritonError)


# ----------------------------------------------------------------------------------------------
# Buckets


def mask_kind(mask: Optional[torch.Tensor]) -> str:
    """"none"; "keys" (bool [B|1, 1, 1, Tk]); "rows" (bool [B|1, 1, Tq, Tk]); "bool" (any other
    boolean mask, e.g. per head); "float" (an additive mask)."""
    if mask is None:
        return "none"
    if mask.dtype != torch.bool:
        return "float"
    if mask.dim() == 4 and mask.shape[1] == 1:
        return "keys" if mask.shape[2] == 1 else "rows"
    return "bool"


def pow2_exponent(n: int) -> int:
    """e with 2**(e-1) < n <= 2**e (0 for n <= 1): lengths in one power-of-two bucket share it."""
    return (n - 1).bit_length() if n > 1 else 0


def bucket_key(
    q: torch.Tensor,  # [B, H, Tq, hd]
    k: torch.Tensor,  # [B, Hkv, Tk, hd]
    v: torch.Tensor,  # [B, Hkv, Tk, hd]
    mask: Optional[torch.Tensor],
    return_probs: bool,
) -> tuple:
    """The dict key of a call's bucket; ``BucketKey.of`` reads it back. No host sync."""
    b, h, tq, hd = q.shape
    tk = k.shape[2]
    return (q.device, q.dtype, b, h, k.shape[1], hd,
            (tq - 1).bit_length() if tq > 1 else 0, (tk - 1).bit_length() if tk > 1 else 0,
            mask_kind(mask), bool(return_probs), q.requires_grad or k.requires_grad or v.requires_grad)


class BucketKey(NamedTuple):
    """A bucket, readable: ``max_q_len`` / ``max_k_len`` are the bucket's power-of-two upper bounds."""

    device: torch.device
    dtype: torch.dtype
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    max_q_len: int
    max_k_len: int
    mask: str
    return_probs: bool
    needs_grad: bool

    @classmethod
    def of(cls, key: tuple) -> "BucketKey":
        fields = list(key)
        fields[6], fields[7] = 1 << key[6], 1 << key[7]
        return cls(*fields)

    def label(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        return (f"{self.device.type}-{dt}-B{self.batch}-H{self.heads}-Hkv{self.kv_heads}-D{self.head_dim}-"
                f"Tq<={self.max_q_len}-Tk<={self.max_k_len}-mask:{self.mask}"
                + ("-probs" if self.return_probs else "") + ("-grad" if self.needs_grad else ""))


class Decision(NamedTuple):
    """One probed bucket: the chosen backend, the median microseconds per timed candidate (empty
    when only one candidate was eligible), and why the others were skipped."""

    key: BucketKey
    chosen: str
    times_us: dict[str, float]
    refused: dict[str, str]


# ----------------------------------------------------------------------------------------------
# Timing


Timer = Callable[..., tuple[float, Any]]  # (fn, device, warmup=, repeats=, budget_s=) -> (median us, last result)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], Any], device: torch.device, *, warmup: int, repeats: int,
               budget_s: float) -> tuple[float, Any]:
    """Median wall microseconds of ``fn()`` over up to ``repeats`` timed calls (at least one; none
    started once ``budget_s`` is spent) after ``warmup`` untimed ones; the device is synchronised
    before and after each timed call. Returns (median us, the last call's result)."""
    out = None
    for _ in range(warmup):
        out = fn()
    times: list[float] = []
    spent = 0.0
    while len(times) < max(1, repeats) and (not times or spent < budget_s):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        dt = time.perf_counter() - t0
        times.append(dt * 1e6)
        spent += dt
    return statistics.median(times), out


# ----------------------------------------------------------------------------------------------
# Policy


@dataclass(frozen=True)
class AutoConfig:
    """What ``AutoAttention`` times and how long.

    candidates: backends timed against each other, in order of preference (ties and near-ties go
        to the earlier one). fallback: for requests no candidate serves, the first that accepts it.
    warmup / repeats / budget_ms: per candidate and bucket, see ``time_calls``.
    keep_first_within: a later candidate replaces the first eligible one only if it is faster by
        more than this fraction of the first one's time (0.05: more than 5 % faster).
    """

    candidates: tuple[str, ...] = ("sdpa", "triton")
    fallback: tuple[str, ...] = ("sdpa", "reference")
    warmup: int = 1
    repeats: int = 5
    budget_ms: float = 25.0
    keep_first_within: float = 0.05

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("AutoConfig.candidates must name at least one backend, got ()")
        if not self.fallback:
            raise ValueError("AutoConfig.fallback must name at least one backend, got ()")
        if self.warmup < 0 or self.repeats < 1:
            raise ValueError(f"AutoConfig needs warmup >= 0 and repeats >= 1, got warmup={self.warmup}, "
                             f"repeats={self.repeats}")
        if not self.budget_ms > 0:
            raise ValueError(f"AutoConfig.budget_ms must be > 0, got {self.budget_ms}")
        if not 0 <= self.keep_first_within < 1:
            raise ValueError(f"AutoConfig.keep_first_within must be in [0, 1), got {self.keep_first_within}")


def failure_reason(name: str, err: BaseException) -> str:
    """A skipped candidate's recorded reason: its refusal, or the kernel error's type and first line."""
    if isinstance(err, RequestRefused):
        return f"{name}: {err}"
    first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
    return f"{name}: {type(err).__name__}" + (f": {first}" if first else "")


def pick_fastest(times_us: dict[str, float], keep_first_within: float) -> str:
    """The key of the smallest time; the first key (in insertion order) unless another is faster by
    more than ``keep_first_within`` of its time. ``times_us`` must not be empty."""
    if not times_us:
        raise ValueError("pick_fastest needs at least one timed candidate, got none")
    first = next(iter(times_us))
    best = min(times_us, key=times_us.__getitem__)
    return first if times_us[best] >= times_us[first] * (1 - keep_first_within) else best


class AutoAttention:
    """Attention backend function that probes each bucket once and then dispatches by dict lookup
    (see the module docstring). ``lookup(name)`` returns a backend; ``timer`` is ``time_calls``."""

    def __init__(self, config: AutoConfig, lookup: Callable[[str], Any], timer: Timer = time_calls) -> None:
        self._lookup = lookup  # backend name -> Backend (``dllm.kernels.attention.backends.get``)
        self.timer = timer
        self._lock = threading.Lock()
        self._table: dict[tuple, Callable] = {}  # bucket_key -> the chosen backend's fn
        self._decisions: list[Decision] = []
        self.configure(config)

    # -- configuration and inspection

    def configure(self, config: AutoConfig) -> None:
        """Use ``config`` from now on (every name must be a backend) and forget all decisions."""
        for name in (*config.candidates, *config.fallback):
            self._lookup(name)  # unknown names raise, listing the valid ones
        self.config = config
        self.reset()

    def reset(self) -> None:
        """Forget every decision: the next call of each bucket probes again."""
        with self._lock:
            self._table.clear()
            self._decisions.clear()

    def decisions(self) -> list[Decision]:
        """The probed buckets, in probe order."""
        return list(self._decisions)

    def host_candidates(self) -> tuple[list[str], list[str]]:
        """(candidates usable on this host, reasons for the others), from ``probe_refusal``."""
        usable, refused = [], []
        for name in self.config.candidates:
            reason = self._lookup(name).probe_refusal()
            (refused.append(reason) if reason else usable.append(name))
        return usable, refused

    # -- the backend function

    def __call__(
        self,
        q: torch.Tensor,  # [B, H, Tq, hd]
        k: torch.Tensor,  # [B, Hkv, Tk, hd]
        v: torch.Tensor,  # [B, Hkv, Tk, hd]
        mask: Optional[torch.Tensor] = None,
        return_probs: bool = False,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        key = bucket_key(q, k, v, mask, return_probs)
        fn = self._table.get(key)
        if fn is None:
            return self._probe(key, q, k, v, mask, return_probs)
        try:
            return fn(q, k, v, mask, return_probs)
        except RequestRefused:
            return self._fallback(q, k, v, mask, return_probs, key[-1])[1].fn(q, k, v, mask, return_probs)

    def _fallback(self, q, k, v, mask, return_probs, needs_grad) -> tuple[dict[str, str], Any]:
        refused: dict[str, str] = {}
        for name in self.config.fallback:
            backend = self._lookup(name)
            reason = backend.probe_refusal() or backend.request_refusal(q, k, v, mask, return_probs, needs_grad)
            if reason is None:
                return refused, backend
            refused[name] = reason
        raise ValueError("no attention backend can serve this request under 'auto': "
                         + "; ".join(f"{n}: {r}" for n, r in refused.items()))

    def _probe(self, key: tuple, q, k, v, mask, return_probs):
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            return self._fallback(q, k, v, mask, return_probs, key[-1])[1].fn(q, k, v, mask, return_probs)
        cfg = self.config
        with self._lock:
            if key in self._table:  # another thread probed it meanwhile
                return self._table[key](q, k, v, mask, return_probs)
            refused: dict[str, str] = {}
            eligible = []
            for name in cfg.candidates:
                backend = self._lookup(name)
                reason = backend.probe_refusal() or backend.request_refusal(q, k, v, mask, return_probs, key[-1])
                (refused.__setitem__(name, reason) if reason else eligible.append(backend))
            times: dict[str, float] = {}
            outs: dict[str, Any] = {}
            skips = probe_failures()
            if len(eligible) >= 2:
                for backend in eligible:
                    call = lambda fn=backend.fn: fn(q, k, v, mask, return_probs)
                    try:
                        times[backend.name], outs[backend.name] = self.timer(
                            call, q.device, warmup=cfg.warmup, repeats=cfg.repeats, budget_s=cfg.budget_ms / 1e3)
                    except skips as e:
                        refused[backend.name] = failure_reason(backend.name, e)
            elif eligible:
                try:
                    outs[eligible[0].name] = eligible[0].fn(q, k, v, mask, return_probs)
                except skips as e:
                    refused[eligible[0].name] = failure_reason(eligible[0].name, e)
            if outs:
                chosen = pick_fastest(times, cfg.keep_first_within) if times else next(iter(outs))
                chosen_fn = next(b.fn for b in eligible if b.name == chosen)
                out = outs[chosen]
            else:  # no candidate serves this request: the fallback does, for the whole bucket
                more, backend = self._fallback(q, k, v, mask, return_probs, key[-1])
                refused.update({n: r for n, r in more.items() if n not in refused})
                chosen, chosen_fn = backend.name, backend.fn
                out = chosen_fn(q, k, v, mask, return_probs)
            self._table[key] = chosen_fn
            self._decisions.append(Decision(BucketKey.of(key), chosen, times, refused))
        return out


__all__ = ["AutoAttention", "AutoConfig", "BucketKey", "Decision", "RequestRefused", "bucket_key", "failure_reason",
           "mask_kind", "pick_fastest", "pow2_exponent", "probe_failures", "time_calls"]
