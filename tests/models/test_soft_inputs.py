"""Soft inputs (dllm/models/core/soft_inputs.py): mixed token embeddings as a forward's input.

- a one-hot mixture is exactly the token path, for every weight-backed family, with and without a KV
  cache, in a left-padded batch, at any span offset (plain mixture and ``renorm_eps = 0``);
- a real mixture changes the logits exactly where it should: at its own rows and, through attention,
  at the rows that see them (block-causal families: not the blocks before it);
- ``mix_embeddings`` is DMax's formula (interpolation, then the norm of the parts' weighted mean);
- a model without an input embedding (an oracle) refuses soft inputs by name, and a span that does
  not fit the forward is refused.
"""

from __future__ import annotations

import pytest
import torch

from dllm.models import tiny
from dllm.models.core.soft_inputs import SoftInputs, mix_embeddings

FAMILIES = ("llada", "dream", "sdar", "fastdllm_v2", "llada2")


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return tiny(request.param, seed=4).eval()


def _ids(model, b: int = 2, t: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 40, (b, t), generator=g)
    ids[:, 8:] = model.mask_id
    return ids


def _one_hot(ids: torch.Tensor, a: int, w: int, mask_id: int, eps=None) -> SoftInputs:
    """Rows [a, a + w): their own token with weight 1 and the mask with weight 0, at every other row."""
    span = ids[:, a:a + w]
    where = torch.zeros(span.shape, dtype=torch.bool)
    where[:, ::2] = True
    tokens = torch.stack([span, torch.full_like(span, mask_id)], dim=-1)  # [B, W, 2]
    weights = torch.stack([torch.ones(span.shape), torch.zeros(span.shape)], dim=-1)
    return SoftInputs(where, tokens, weights, renorm_eps=eps, offset=a)


@pytest.mark.parametrize("eps", [None, 0.0], ids=["plain", "renorm0"])
def test_one_hot_equals_token_path(model, eps):
    ids = _ids(model)
    with torch.inference_mode():
        plain = model(ids).logits
        soft = model(ids, soft_inputs=_one_hot(ids, 4, 6, model.mask_id, eps)).logits
    assert torch.equal(plain, soft)


def test_one_hot_equals_token_path_padded(model):
    ids = _ids(model)
    kpm = torch.ones(ids.shape, dtype=torch.bool)
    kpm[1, :3] = False  # a left-padded row
    model.packs_padded_rows = False  # soft inputs run the padded forward: the token path's padded one is its twin
    with torch.inference_mode():
        plain = model(ids, key_padding_mask=kpm).logits
        soft = model(ids, key_padding_mask=kpm, soft_inputs=_one_hot(ids, 3, 8, model.mask_id)).logits
    assert torch.equal(plain[kpm], soft[kpm])


def test_one_hot_equals_token_path_with_cache(model):
    """A full forward fills the buffers, then a cached query of columns [8, 12) with soft inputs at
    [9, 12): logits and the K/V written equal the token path's."""
    ids = _ids(model)
    length = ids.shape[1]
    results = []
    for soft in (None, _one_hot(ids[:, 8:], 1, 3, model.mask_id)):
        kv = model.new_kv_cache(ids.shape[0], length)
        with torch.inference_mode():
            model(ids, cache=kv.view(0, length))
            out = model(ids[:, 8:], cache=kv.view(8, length), soft_inputs=soft).logits
        results.append((out, [k.clone() for k in kv.k]))
    (a, ka), (b, kb) = results
    assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(ka, kb))


def test_mixture_changes_what_sees_it(model):
    ids = _ids(model)
    where = torch.zeros((2, 4), dtype=torch.bool)
    where[0, 1] = True  # row 0, input row 9 only
    span = ids[:, 8:12]
    tokens = torch.stack([torch.full_like(span, 20), torch.full_like(span, model.mask_id)], dim=-1)
    weights = torch.stack([torch.full(span.shape, 0.7), torch.full(span.shape, 0.3)], dim=-1)
    with torch.inference_mode():
        plain = model(ids).logits
        soft = model(ids, soft_inputs=SoftInputs(where, tokens, weights, renorm_eps=1e-6, offset=8)).logits
    assert torch.equal(plain[1], soft[1])  # the other row is untouched
    assert (plain[0, 9] - soft[0, 9]).abs().max() > 1e-2
    bs = model.block_size
    if bs is not None:  # block-causal: blocks before the soft row's block cannot see it (to the MoE's
        first = 9 // bs * bs  # rounding: LLaDA 2's experts batch the tokens they route, soft rows too)
        assert torch.allclose(plain[0, :first], soft[0, :first], atol=1e-5, rtol=0)


def test_mix_embeddings_is_dmax_interpolation():
    torch.manual_seed(0)
    embed = torch.nn.Embedding(10, 6)
    p = torch.tensor([[0.8, 0.25]])  # [1, 2]
    tok = torch.tensor([[3, 4]])
    tokens = torch.stack([tok, torch.full_like(tok, 9)], dim=-1)  # [1, 2, 2]: token, mask 9
    weights = torch.stack([p, 1 - p], dim=-1)
    e, m = embed.weight[tok], embed.weight[9]  # [1, 2, 6], [6]
    mixed = p[..., None] * e + (1 - p)[..., None] * m
    target = p * e.norm(dim=-1) + (1 - p) * m.norm()
    want = mixed * (target / (mixed.norm(dim=-1) + 1e-6))[..., None]
    got = mix_embeddings(embed, tokens, weights, 1e-6)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    assert torch.allclose(mix_embeddings(embed, tokens, weights), mixed, atol=1e-6, rtol=0)
    assert torch.allclose(got.norm(dim=-1), target, atol=1e-5)  # back on the parts' mean norm


def test_refusals():
    from dllm.models.oracle import OracleLM

    oracle = OracleLM()
    ids = torch.full((1, 4), oracle.mask_id)
    with pytest.raises(NotImplementedError, match="has no input embedding"):
        oracle(ids, soft_inputs=_one_hot(ids, 0, 2, oracle.mask_id))
    model = tiny("llada", seed=1)
    ids = _ids(model)
    with pytest.raises(ValueError, match=r"do not fit a forward of 2 rows x 12 positions"):
        model(ids, soft_inputs=_one_hot(ids, 0, 6, model.mask_id).at(8))  # rows [8, 14) of 12
    with pytest.raises(ValueError, match="weights must be a float tensor"):
        SoftInputs(torch.ones((1, 2), dtype=torch.bool), torch.zeros((1, 2, 2), dtype=torch.long),
                   torch.zeros((1, 2, 3)))


def _mixture(ids: torch.Tensor, mask_id: int) -> SoftInputs:
    """A real mixture (0.7 token 20, 0.3 the mask) at every row of columns [8, 12)."""
    span = ids[:, 8:12]
    where = torch.ones(span.shape, dtype=torch.bool)
    tokens = torch.stack([torch.full_like(span, 20), torch.full_like(span, mask_id)], dim=-1)
    weights = torch.stack([torch.full(span.shape, 0.7), torch.full(span.shape, 0.3)], dim=-1)
    return SoftInputs(where, tokens, weights, renorm_eps=1e-6, offset=8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["reference", "fused"])
@pytest.mark.parametrize("cached", [False, True], ids=["plain", "cached_logits"])
def test_a_soft_forward_leaves_another_threads_forward_alone(dtype, cached):
    """While one thread runs a forward with soft inputs (DMax), a token forward of the same model from
    another thread (a second engine on a served model) gets its own logits: the soft inputs are the
    soft forward's only. The soft forward is held inside its embedding (an event pair) while the other
    thread runs, so the two overlap on every run."""
    import threading

    model = tiny("llada", seed=4, dtype=dtype).eval()
    ids = _ids(model)
    length = ids.shape[1]

    def plain() -> torch.Tensor:
        with torch.inference_mode():
            if not cached:
                return model(ids).logits
            kv = model.new_kv_cache(ids.shape[0], length)
            return model.cached_logits(ids, torch.arange(length).expand(ids.shape), None, kv.view(0, length))

    alone = plain()
    with torch.inference_mode():
        soft_alone = model(ids, soft_inputs=_mixture(ids, model.mask_id)).logits
    assert not torch.equal(alone, soft_alone)

    inside, done = threading.Event(), threading.Event()
    results: dict[str, torch.Tensor] = {}
    errors: list[BaseException] = []
    soft_thread: list[int] = []

    def hold(module, args, out):  # in the soft thread only: wait there until the plain forward is done
        if threading.get_ident() == soft_thread[0]:
            inside.set()
            assert done.wait(30), "the plain forward did not finish"

    def run_soft() -> None:
        try:
            soft_thread.append(threading.get_ident())
            with torch.inference_mode():
                results["soft"] = model(ids, soft_inputs=_mixture(ids, model.mask_id)).logits
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            inside.set()

    def run_plain() -> None:
        try:
            assert inside.wait(30), "the soft forward never reached its embedding"
            results["plain"] = plain()
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
        finally:
            done.set()

    handle = model.input_embedding().register_forward_hook(hold)
    try:
        threads = [threading.Thread(target=run_soft), threading.Thread(target=run_plain)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        handle.remove()
    assert not errors, errors
    assert torch.equal(results["plain"], alone)
    assert torch.equal(results["soft"], soft_alone)
    assert not model.input_embedding()._forward_hooks  # every hook removed


@pytest.mark.parametrize("where, eps, match", [
    (torch.ones(2, dtype=torch.bool), None, r"where must be bool \[B, W\], got torch.bool \[2\]"),
    (torch.ones((1, 2, 1), dtype=torch.bool), None, r"where must be bool \[B, W\], got torch.bool \[1, 2, 1\]"),
    (torch.ones((1, 2)), None, r"where must be bool \[B, W\], got torch.float32 \[1, 2\]"),
    (torch.ones((1, 2), dtype=torch.bool), -1e-3, r"renorm_eps must be None or a finite number >= 0.*got -0.001"),
    (torch.ones((1, 2), dtype=torch.bool), float("nan"), r"renorm_eps must be .* got nan"),
], ids=["1d", "3d", "float", "negative-eps", "nan-eps"])
def test_malformed_soft_inputs_are_refused_by_name(where, eps, match):
    """A ``where`` that is not [B, W] named itself (it was a bare unpacking error); a negative ``renorm_eps``
    (``|e| + eps`` may reach 0: an infinite input) and a NaN one are refused."""
    tokens = torch.zeros((1, 2, 2), dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        SoftInputs(where, tokens, torch.full((1, 2, 2), 0.5), renorm_eps=eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_hot_mixture_is_the_embedding_as_documented(dtype):
    """The module docstring's claim: a one-hot mixture is its token's embedding exactly without
    ``renorm_eps`` in every dtype, and with ``renorm_eps = 0`` in float32 (a half-precision norm of
    the parts is rounded, as DMax's, so there it is only close)."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(100, 64).to(dtype)
    tokens = torch.stack([torch.arange(100), torch.zeros(100, dtype=torch.long)], dim=-1)  # [100, 2]
    weights = torch.stack([torch.ones(100), torch.zeros(100)], dim=-1)
    assert torch.equal(mix_embeddings(embed, tokens, weights), embed.weight)
    renormed = mix_embeddings(embed, tokens, weights, 0.0)
    if dtype == torch.float32:
        assert torch.equal(renormed, embed.weight)
    else:
        assert torch.allclose(renormed.float(), embed.weight.float(), rtol=1e-2, atol=0)
