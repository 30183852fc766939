"""``attn_backend="auto"`` (``dllm.kernels.autotune.AutoAttention``): probes once per shape bucket,
picks the fastest eligible candidate, skips refusing ones with their reason, respects
``return_probs``, and returns exactly the chosen backend's output; inside a model it decodes the
same tokens as ``sdpa``."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

import dllm
from dllm.kernels.attention import AUTO, Backend, auto_decisions, auto_policy, backends, reset_auto, resolve_backend
from dllm.kernels.autotune import (AutoAttention, AutoConfig, RequestRefused, bucket_key, mask_kind, pick_fastest,
                                   pow2_exponent)
from dllm.models.tiny import tiny
from dllm.registry import Registry

from .conftest import INTERPRETED

SLEEP_S = 0.02  # the slow fake backend's extra time per call


@dataclass(frozen=True)
class Fake(Backend):
    """A backend for the tests: out = q + marker; refuses on request when told to."""

    host_reason: str | None = None
    refuse_float_masks: bool = False

    def probe_refusal(self):
        return self.host_reason

    def request_refusal(self, q, k, v, mask, return_probs, needs_grad):
        if self.refuse_float_masks and mask is not None and mask.dtype != torch.bool:
            return f"{self.name}: boolean masks only"
        return super().request_refusal(q, k, v, mask, return_probs, needs_grad)


def _fake_fn(marker: float, calls: list, name: str, sleep_s: float = 0.0, probs: bool = False, raises: bool = False):
    def fn(q, k, v, mask=None, return_probs=False):
        calls.append(name)
        if raises:
            raise RequestRefused("cannot express this mask")
        if sleep_s:
            time.sleep(sleep_s)
        return q + marker, (torch.ones(q.shape[:-1] + (k.shape[2],)) if return_probs else None)
    return fn


@pytest.fixture
def fakes():
    """(registry of fake backends, list of the names of every call in order)."""
    calls: list[str] = []
    reg: Registry[Backend] = Registry("fake attention backend")
    reg.add("slow", Fake("slow", _fake_fn(1.0, calls, "slow", SLEEP_S), False, 0))
    reg.add("fast", Fake("fast", _fake_fn(2.0, calls, "fast"), False, 0))
    reg.add("probs", Fake("probs", _fake_fn(3.0, calls, "probs"), True, 0))
    reg.add("absent", Fake("absent", _fake_fn(4.0, calls, "absent"), False, 0, host_reason="absent: not on this host"))
    reg.add("boolonly", Fake("boolonly", _fake_fn(5.0, calls, "boolonly"), False, 0, refuse_float_masks=True))
    reg.add("raiser", Fake("raiser", _fake_fn(6.0, calls, "raiser", raises=True), False, 0))
    reg.add("nograd", Fake("nograd", _fake_fn(7.0, calls, "nograd"), False, 0, differentiable=False))
    return reg, calls


def _qkv(tq=5, tk=40, b=1, h=2, hkv=1, d=8, grad=False):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, tq, d, generator=g, requires_grad=grad)
    k = torch.randn(b, hkv, tk, d, generator=g)
    return q, k, k.clone()


def _policy(reg, candidates, fallback=("fast",), timer=None) -> AutoAttention:
    cfg = AutoConfig(candidates=candidates, fallback=fallback, warmup=0, repeats=2)
    return AutoAttention(cfg, reg.get, **({"timer": timer} if timer else {}))


def test_bucket_key_rounds_lengths_to_powers_of_two():
    assert [pow2_exponent(n) for n in (1, 2, 3, 4, 5, 8, 9, 1024, 1025)] == [0, 1, 2, 2, 3, 3, 4, 10, 11]
    q5, k40, _ = _qkv(5, 40)
    q8, k64, _ = _qkv(8, 64)
    q9, _, _ = _qkv(9, 40)
    assert bucket_key(q5, k40, k40, None, False) == bucket_key(q8, k64, k64, None, False)
    assert bucket_key(q5, k40, k40, None, False) != bucket_key(q9, k40, k40, None, False)
    assert bucket_key(q5, k40, k40, None, False) != bucket_key(q5, k40, k40, None, True)
    assert mask_kind(None) == "none"
    assert mask_kind(torch.ones(1, 1, 1, 40, dtype=torch.bool)) == "keys"
    assert mask_kind(torch.ones(1, 1, 5, 40, dtype=torch.bool)) == "rows"
    assert mask_kind(torch.ones(1, 2, 5, 40, dtype=torch.bool)) == "bool"
    assert mask_kind(torch.zeros(1, 1, 5, 40)) == "float"


def test_probe_picks_the_faster_backend_and_caches_the_bucket(fakes):
    reg, calls = fakes
    auto = _policy(reg, ("slow", "fast"))
    q, k, v = _qkv(tq=5)
    out, probs = auto(q, k, v)
    assert torch.equal(out, q + 2.0) and probs is None  # the chosen backend's own output
    (decision,) = auto.decisions()
    assert decision.chosen == "fast" and set(decision.times_us) == {"slow", "fast"}
    assert decision.times_us["slow"] >= SLEEP_S * 1e6 > decision.times_us["fast"]
    assert decision.key.max_q_len == 8 and decision.key.max_k_len == 64 and decision.key.mask == "none"
    n_probe = len(calls)
    q7, _, _ = _qkv(tq=7)  # same bucket: no probe, one call of the chosen backend
    assert torch.equal(auto(q7, k, v)[0], q7 + 2.0)
    assert calls[n_probe:] == ["fast"] and len(auto.decisions()) == 1
    auto(*_qkv(tq=9))  # a new bucket is probed
    assert len(auto.decisions()) == 2 and "slow" in calls[n_probe + 1:]
    auto.reset()
    assert auto.decisions() == []


def test_probe_with_a_fake_timer_and_the_preference_margin(fakes):
    reg, calls = fakes
    timings = {"slow": 100.0, "fast": 97.0}  # microseconds by backend name

    def timer(fn, device, **_):
        out = fn()
        return timings[calls[-1]], out

    q, k, v = _qkv()
    auto = _policy(reg, ("slow", "fast"), timer=timer)
    assert auto(q, k, v)[0].equal(q + 1.0)  # 3 % faster is within keep_first_within: slow stays
    assert auto.decisions()[0].times_us == {"slow": 100.0, "fast": 97.0}
    timings["fast"] = 90.0
    auto.reset()
    assert auto(q, k, v)[0].equal(q + 2.0) and auto.decisions()[0].chosen == "fast"
    assert pick_fastest({"a": 10.0, "b": 9.0}, 0.0) == "b" and pick_fastest({"a": 10.0}, 0.5) == "a"


def test_refusing_backends_are_skipped_with_their_reasons(fakes):
    reg, calls = fakes
    auto = _policy(reg, ("absent", "boolonly", "raiser", "slow", "fast"))
    q, k, v = _qkv()
    float_mask = torch.zeros(1, 1, 1, k.shape[2])
    assert auto(q, k, v, float_mask)[0].equal(q + 2.0)
    (d,) = auto.decisions()
    assert d.refused == {"absent": "absent: not on this host", "boolonly": "boolonly: boolean masks only",
                         "raiser": "raiser: cannot express this mask"}
    assert set(d.times_us) == {"slow", "fast"} and "absent" not in calls and "boolonly" not in calls


def test_a_chosen_backend_that_refuses_a_later_call_falls_back(fakes):
    reg, calls = fakes
    state = {"refuse": False}

    def picky(q, k, v, mask=None, return_probs=False):
        calls.append("picky")
        if state["refuse"]:
            raise RequestRefused("not this mask")
        return q + 8.0, None

    reg.add("picky", Fake("picky", picky, False, 0))
    auto = _policy(reg, ("picky",), fallback=("fast",))
    q, k, v = _qkv()
    assert auto(q, k, v)[0].equal(q + 8.0) and auto.decisions()[0].chosen == "picky"
    state["refuse"] = True
    calls.clear()
    assert auto(q, k, v)[0].equal(q + 2.0) and calls == ["picky", "fast"]


def test_return_probs_and_autograd_are_respected(fakes):
    reg, _ = fakes
    auto = _policy(reg, ("slow", "fast"), fallback=("fast", "probs"))
    q, k, v = _qkv()
    out, probs = auto(q, k, v, None, True)
    assert out.equal(q + 3.0) and probs is not None
    (d,) = auto.decisions()
    assert d.chosen == "probs" and d.key.return_probs and d.times_us == {}
    assert d.refused["fast"] == "fast: cannot return attention probabilities"
    auto = _policy(reg, ("nograd", "fast"))
    qg, k, v = _qkv(grad=True)
    assert auto(qg, k, v)[0].requires_grad and auto.decisions()[0].chosen == "fast"
    assert "forward only" in auto.decisions()[0].refused["nograd"]


def test_config_errors_name_the_bad_value(fakes):
    reg, _ = fakes
    with pytest.raises(ValueError, match="repeats >= 1.*repeats=0"):
        AutoConfig(repeats=0)
    with pytest.raises(ValueError, match="at least one backend"):
        AutoConfig(candidates=())
    with pytest.raises(KeyError, match="nope"):
        AutoAttention(AutoConfig(candidates=("nope",)), reg.get)


def test_auto_output_equals_the_chosen_real_backend():
    auto = AutoAttention(AutoConfig(candidates=("sdpa", "sdpa_plain", "reference", "triton"), warmup=0, repeats=1),
                         backends.get)
    q, k, v = _qkv(tq=6, tk=48, h=4, hkv=2, d=16)
    mask = torch.ones(1, 1, 1, 48, dtype=torch.bool)
    mask[..., :5] = False
    out, _ = auto(q, k, v, mask)
    (d,) = auto.decisions()
    assert d.chosen in ("sdpa", "sdpa_plain", "reference") and len(d.times_us) == 3
    assert "triton" in d.refused and "triton" not in d.times_us  # never timed on CPU tensors
    assert torch.equal(out, backends.get(d.chosen).fn(q, k, v, mask, False)[0])


def test_resolve_auto_here():
    res = resolve_backend("auto")
    if torch.cuda.is_available() and not INTERPRETED:
        assert res.backend is AUTO and res.backend.name == "auto"
    else:  # on CPU Triton only runs interpreted: nothing to measure, auto stays sdpa
        assert res.backend.name == "sdpa"
        assert any(r.startswith("triton:") and "not probed" in r for r in res.refused), res.refused
    assert resolve_backend("auto", need_probs=True).backend.name == "reference"
    cpu = torch.zeros(1, 1, 4, 16)
    assert "CUDA" in backends.get("triton").request_refusal(cpu, cpu, cpu, None, False, False)


def test_auto_never_gives_triton_a_row_mask():
    """A [B, 1, Tq, Tk] mask (SDAR's block-causal one, a ragged batch's pad rows) is converted by the
    Triton backend with a host read, which a CUDA graph capture cannot make: auto refuses it there
    (on any device: the mask is checked before the device), key-padding masks are left to the device
    check."""
    triton = backends.get("triton")
    q = torch.zeros(2, 1, 4, 16)
    rows = torch.ones(2, 1, 4, 8, dtype=torch.bool)
    keys = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    reason = triton.request_refusal(q, q, q, rows, False, False)
    assert reason is not None and "row masks" in reason and "(2, 1, 4, 8)" in reason
    assert "CUDA" in triton.request_refusal(q, q, q, keys, False, False)


@pytest.fixture
def measuring_auto():
    """The process-wide auto policy measuring sdpa against sdpa_plain (both run on CPU)."""
    policy = auto_policy()
    old = policy.config
    policy.configure(AutoConfig(candidates=("sdpa", "sdpa_plain"), warmup=0, repeats=1))
    yield policy
    policy.configure(old)


PROMPT = "[BOS] sort D A C B [SEP]"


@pytest.mark.filterwarnings("ignore:the prompt has")
def test_auto_in_a_tiny_model_decodes_the_same_tokens_as_sdpa():
    ref = dllm.generate(tiny("llada", attn_backend="sdpa"), PROMPT, gen_length=5).generated
    model = tiny("llada")  # auto, as resolved on this host
    assert torch.equal(dllm.generate(model, PROMPT, gen_length=5).generated, ref)


@pytest.mark.filterwarnings("ignore:the prompt has")
def test_measuring_auto_in_a_tiny_model_decodes_the_same_tokens_as_sdpa(measuring_auto):
    ref = dllm.generate(tiny("llada", attn_backend="sdpa"), PROMPT, gen_length=5).generated
    reset_auto()
    model = tiny("llada", attn_backend="auto")
    assert model.attn_backend == "auto"
    assert torch.equal(dllm.generate(model, PROMPT, gen_length=5).generated, ref)
    decisions = auto_decisions()
    assert decisions and all(d.chosen in ("sdpa", "sdpa_plain") and len(d.times_us) == 2 for d in decisions)
    assert len({d.key for d in decisions}) == len(decisions)  # one probe per bucket


@pytest.mark.parametrize("alone", [False, True])
def test_a_candidate_whose_kernel_fails_to_compile_is_skipped(fakes, alone):
    """A Triton kernel that cannot run on this device (a tile past its shared memory) while probed:
    skipped with the error's type as its reason, not an error of the forward; with no other candidate
    the fallback serves the bucket."""
    errors = pytest.importorskip("triton.runtime.errors")
    reg, calls = fakes

    def too_big(q, k, v, mask=None, return_probs=False):
        calls.append("toobig")
        raise errors.OutOfResources(232448, 101376, "shared memory")

    reg.add("toobig", Fake("toobig", too_big, False, 0))
    auto = _policy(reg, ("toobig",) if alone else ("toobig", "slow"), fallback=("fast",))
    q, k, v = _qkv()
    assert auto(q, k, v)[0].equal(q + (2.0 if alone else 1.0))
    (d,) = auto.decisions()
    assert d.chosen == ("fast" if alone else "slow") and d.refused["toobig"].startswith("toobig: OutOfResources")
