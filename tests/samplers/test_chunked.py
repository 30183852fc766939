"""The references' float64 statistics in row chunks (dllm.samplers.chunked): same bits as the
one-piece computation, and no [B, L, V] float64 tensor in any decode step."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dllm
from dllm.models.tiny import tiny
from dllm.samplers import chunked, samplers
from dllm.samplers.chunked import argmax_excluding, gumbel_argmax, softmax_prob, window_uniforms


def _logits(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("chunk", [1, 7 * 50, 10**9])
def test_softmax_prob_is_bit_equal_to_one_piece(chunk):
    logits = _logits(3, 20, 50)
    tokens = logits.argmax(-1)
    want = torch.softmax(logits.to(torch.float64), dim=-1).gather(-1, tokens[..., None])[..., 0]
    got = softmax_prob(logits, tokens, chunk_elements=chunk)
    assert got.dtype == torch.float64 and torch.equal(got, want)


@pytest.mark.parametrize("chunk", [50, 3 * 50, 10**9])
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_gumbel_argmax_draws_the_one_piece_stream(chunk, temperature):
    logits = _logits(2, 30, 50, seed=1)
    gen = torch.Generator().manual_seed(5)
    u = torch.rand(logits.shape, dtype=torch.float64, generator=gen)
    want = argmax_excluding(torch.exp(logits.to(torch.float64)) / (-torch.log(u)) ** temperature, 3)
    got = gumbel_argmax(logits, temperature, torch.Generator().manual_seed(5), 3, chunk_elements=chunk)
    assert torch.equal(got, want)
    assert not (got == 3).any()


@pytest.mark.parametrize("window", [(0, 30), (4, 12), (25, 30), (0, 1)])
@pytest.mark.parametrize("chunk", [50, 4 * 50, 10**9])
def test_window_uniforms_are_the_slice_of_one_draw(window, chunk):
    shape = torch.Size((3, 30, 50))
    full = torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    got = window_uniforms(shape, window, torch.Generator().manual_seed(9), torch.device("cpu"), chunk_elements=chunk)
    assert torch.equal(got, full[:, window[0]:window[1]])


def test_the_stream_continues_where_one_draw_would_leave_it():
    shape = torch.Size((2, 10, 40))
    g1, g2 = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    torch.rand(shape, dtype=torch.float64, generator=g1)
    window_uniforms(shape, (3, 6), g2, torch.device("cpu"), chunk_elements=40)
    assert torch.equal(torch.rand(5, generator=g1), torch.rand(5, generator=g2))


def _model(vocab):
    return tiny("llada", vocab_size=vocab, tokenizer=False, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2,
                mlp_hidden=64, seed=3)


def _sampler_names():
    return sorted(entry.name for entry in samplers)


def _run(model, prompt, name, temperature, cache):
    try:
        return dllm.generate(model, prompt, sampler=name, gen_length=16, block_length=16, temperature=temperature,
                             cache=cache, seed=0)
    except ValueError as exc:
        if "greedy only" in str(exc):
            return None
        raise


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_chunking_changes_no_token(monkeypatch, temperature):
    """Every sampler, chunked a row at a time vs in one piece: the same tokens."""
    model = _model(512)
    prompt = torch.randint(10, 60, (2, 24), generator=torch.Generator().manual_seed(0))
    checked = 0
    for name in _sampler_names():
        monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 1 << 30)
        one = _run(model, prompt, name, temperature, "none")
        if one is None:
            continue
        monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 512)
        rows = _run(model, prompt, name, temperature, "none")
        assert torch.equal(one.sequences, rows.sequences), name
        checked += 1
    assert checked >= 8


class _Float64Watch(TorchDispatchMode):
    """Records every float64 tensor an op creates with at least ``limit`` elements."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.seen = limit, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.numel() >= self.limit:
                self.seen.append((str(func), tuple(t.shape)))
        return out


def _check_no_canvas_sized_float64(runs, vocab, cache, prompt_length=200):
    model = _model(vocab)
    prompt = torch.randint(10, 60, (1, prompt_length), generator=torch.Generator().manual_seed(1))
    length = prompt.shape[1] + 16
    ran = 0
    for name, temperature in runs:
        watch = _Float64Watch(length * vocab)
        with torch.no_grad(), watch:
            out = _run(model, prompt, name, temperature, cache)
        if out is None:
            continue
        assert watch.seen == [], (name, temperature, watch.seen[:3])
        ran += 1
    return ran


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_no_canvas_sized_float64_tensor_in_any_sampler(monkeypatch, cache):
    """No decode step of any sampler, greedy or sampled, creates a float64 tensor of B x L x V
    elements (the references create two per step without a cache). A 4,096-word vocabulary with the
    chunk scaled like it (the same rows per chunk as LLaDA-8B's 126,464 words get by default)."""
    vocab = 4096
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", chunked.CHUNK_ELEMENTS * vocab // 126_464)
    runs = [(name, t) for name in _sampler_names() for t in (0.0, 1.0)]
    assert _check_no_canvas_sized_float64(runs, vocab, cache) >= 20


@pytest.mark.slow
def test_no_canvas_sized_float64_tensor_at_the_real_vocabulary():
    """The same at LLaDA-8B's vocabulary (126,464) and the default chunk, for the recommended
    sampler and the two that normalise (dawn) or draw (low_confidence at T > 0) over the canvas."""
    runs = [("fast", 0.0), ("dawn", 0.0), ("low_confidence", 1.0)]
    assert _check_no_canvas_sized_float64(runs, 126_464, "none", prompt_length=100) == 3


@pytest.mark.parametrize("b,length,start,w", [(1, 12, 0, 12), (1, 12, 3, 5), (2, 9, 4, 5), (3, 7, 0, 2)])
def test_columns_gumbel_argmax_is_the_window_of_one_canvas_draw(b, length, start, w):
    """The Gumbel-max on columns [start, start + W) of uniforms drawn over [B, L, V] at once, in pieces of a
    few rows (no [B, W, V] float64): equal to drawing the whole canvas, perturbing it and slicing; the
    generator ends where the whole draw leaves it."""
    from dllm.samplers._ops import gumbel_perturb
    from dllm.samplers.chunked import columns_gumbel_argmax

    v, mask = 11, 4
    logits = torch.randn(b, w, v, generator=torch.Generator().manual_seed(1)) * 3  # [B, W, V]
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    got = columns_gumbel_argmax(logits, 0.7, g1, mask, length, start, chunk_elements=2 * v)
    u = torch.rand((b, length, v), dtype=torch.float64, generator=g2)[:, start:start + w]  # [B, W, V]
    assert torch.equal(got, argmax_excluding(gumbel_perturb(logits, 0.7, u), mask))
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))  # the same stream after


@pytest.mark.parametrize("vocab", [2, 3, 80, 1000])
def test_argmax_excluding_is_the_argmax_without_the_banned_id(vocab):
    g = torch.Generator().manual_seed(vocab)
    for banned in sorted({0, 1, vocab // 2, vocab - 1}):
        z = torch.randn(16, 5, vocab, generator=g)
        z[::2, :, banned] = 50.0  # the banned id is the arg-max in half the rows
        got = argmax_excluding(z, banned)
        want = z.masked_fill(torch.arange(vocab) == banned, float("-inf")).argmax(-1)  # first index of the max
        assert torch.equal(got, want), banned
        keep = z.argmax(-1) != banned
        assert torch.equal(got[keep], z.argmax(-1)[keep])  # elsewhere exactly the arg-max
    ties = torch.tensor([[3.0, 1.0, 3.0, 3.0]])
    assert argmax_excluding(ties, 0).item() == 2 and argmax_excluding(ties, 1).item() == 0
    for banned in (0, 1, vocab):  # keepdim: the same index with the last axis kept, on every path
        z = torch.randn(4, 3, vocab, generator=g)
        assert torch.equal(argmax_excluding(z, banned, keepdim=True), argmax_excluding(z, banned)[..., None])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_excluding_is_the_probability_at_the_argmax_bit_for_bit(dtype):
    """``max_excluding`` of a monotone function of the logits (their float64 softmax, as ``credit``
    reads it, or the exp of their float64 log-softmax, as ``klass``) is that function gathered at
    ``argmax_excluding``: equal maxima, a dominant banned id and a banned id outside V included."""
    from dllm.samplers.chunked import max_excluding, pick_last

    g = torch.Generator().manual_seed(5)
    v = 40
    logits = (torch.randn(5, 7, v, generator=g) * 4).to(dtype)
    logits[::2, :, 6] = 30.0  # the banned id is the arg-max there
    logits[1, :, 2] = logits[1, :, 9] = 20.0  # equal maxima
    for probs in (torch.softmax(logits, dim=-1, dtype=torch.float64),
                  torch.log_softmax(logits, dim=-1, dtype=torch.float64).exp()):
        for banned in (6, 0, v - 1, v, None):
            x0 = argmax_excluding(logits, banned if banned is not None else v)
            assert torch.equal(max_excluding(probs, banned), pick_last(probs, x0)), banned


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_confidence_is_the_gathered_probability_bit_for_bit(dtype):
    """At T = 0 ``propose_with_confidence`` takes x0 and p(x0) from one float64 softmax, the largest
    probability without the mask id (``greedy_with_prob``): the arg-max's token and the same float64 bits as the softmax gathered at the arg-max, ties,
    a dominant mask id and a window narrower than the query included."""
    from dllm.samplers._ops import propose_with_confidence
    from dllm.state import StepInput

    g = torch.Generator().manual_seed(11)
    v, mask_id = 50, 7
    logits = (torch.randn(6, 9, v, generator=g) * 4).to(dtype)
    logits[::2, :, mask_id] = 30.0  # the mask id is the arg-max there
    logits[1, :, 3] = logits[1, :, 5] = 20.0  # equal maxima
    inp = StepInput(logits=logits, tokens=torch.full((6, 9), mask_id), active=torch.ones(6, 9, dtype=torch.bool),
                    query_start=0, window=(2, 8), step=0, steps=None, mask_id=mask_id, temperature=0.0,
                    generator=None)
    tokens, conf = propose_with_confidence(inp)
    x0 = argmax_excluding(logits[:, 2:8], mask_id)
    assert torch.equal(tokens[:, 2:8], x0)
    assert torch.equal(conf[:, 2:8], softmax_prob(logits[:, 2:8], x0))
    assert conf[:, :2].isneginf().all() and conf[:, 8:].isneginf().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_greedy_with_prob_is_the_argmax_and_its_gathered_probability(dtype):
    """``greedy_with_prob`` (one softmax, ``where``, ``max``) against the five-call path it replaces
    (``argmax_excluding`` of the logits, the float64 softmax gathered there): the same tokens and
    bits with maxima one ulp apart, equal maxima, ``-inf`` columns, a dominant banned id, the banned
    id 0, V - 1 or outside V, and logits near 0 and near the dtype's largest values."""
    from dllm.samplers.chunked import greedy_of_probs, greedy_with_prob

    g = torch.Generator().manual_seed(3)
    v = 64
    logits = (torch.randn(8, 5, v, generator=g) * 3).to(dtype)
    top = logits.amax(dim=-1, keepdim=True)
    logits[0] = torch.where(logits[0] == top[0], logits[0], -float("inf"))  # only the maxima finite
    nxt = torch.nextafter(top[1], torch.full_like(top[1], float("inf")))  # one ulp above the maximum
    logits[1].scatter_(-1, torch.full_like(top[1], 17, dtype=torch.long), nxt)
    logits[2, :, 4] = logits[2, :, 40] = logits[2].amax() + 1  # equal maxima
    logits[3] *= 1e-3  # near 0
    logits[4] = logits[4] / logits[4].abs().amax() * (0.5 * torch.finfo(dtype).max)  # near the largest
    logits[5, :, 9] = logits[5].amax() + 700  # a dominant id (banned below): the others' p ~ 1e-300
    probs = torch.softmax(logits, dim=-1, dtype=torch.float64)
    for banned in (9, 0, v - 1, v, None):
        x0, p = greedy_with_prob(logits, banned)
        want = argmax_excluding(logits, banned if banned is not None else v)
        assert torch.equal(x0, want), banned
        assert torch.equal(p, softmax_prob(logits, want)), banned
        x0, p = greedy_of_probs(probs, banned)  # the same off a softmax already made (LoPA's Proposals)
        assert torch.equal(x0, want) and torch.equal(p, softmax_prob(logits, want)), banned
    with pytest.raises(ValueError, match="float64 softmax, got torch.float32"):
        greedy_of_probs(probs.float(), 9)
    # the documented exception: every other id more than 745 below the banned one underflows to p = 0,
    # so the token is the first such id, not the logits' arg-max; p is 0 either way
    logits[5, :, 9] = logits[5].amax() + 800
    x0, p = greedy_with_prob(logits[5], 9)
    want = argmax_excluding(logits[5], 9)
    assert (p == 0).all() and torch.equal(p, softmax_prob(logits[5], want)) and (x0 == 0).all()
