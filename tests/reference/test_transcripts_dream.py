"""Sanity tests of the reference transcripts themselves (no dependency on ``dllm``): Dream's ``diffusion_generate``, Fast-dLLM's Dream threshold decoder and KLASS's.

The references are driven by a toy ``model_fn`` (``toy.ToyLM``), which records every canvas it is
called on. The tests check the structural properties the original samplers are known to have (from
their source), the exact random-number streams they consume, and a few hand-checkable cases (the Dream shift, top-p).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .decoders.dream_generate import dream_generate, dream_sample_tokens, dream_top_k_logits, dream_top_p_logits
from .decoders.llada_generate import MaskCommitError
from .toy import MASK, VOCAB, ToyLM, make_prompt


# ----------------------------------------------------------------------------------------------
# Dream
# ----------------------------------------------------------------------------------------------

DREAM_ALGS = ["origin", "maskgit_plus", "topk_margin", "entropy"]
CONF_ALGS = ["maskgit_plus", "topk_margin", "entropy"]


def test_dream_logit_shift():
    """Raw row i strongly predicts token f(i); after the shift, position p gets f(p - 1)."""
    n_gen, lp = 8, 3

    def f(i):
        return 5 + (7 * i) % 30

    def model_fn(x, am, tok_idx):
        b, n = x.shape
        logits = torch.zeros(b, n, VOCAB)
        for i in range(n):
            logits[:, i, f(i)] = 10.0
        return logits

    prompt = make_prompt(batch=2, length=lp)
    for alg in DREAM_ALGS:
        torch.manual_seed(0)
        out = dream_generate(model_fn, prompt, max_new_tokens=n_gen, steps=n_gen, alg=alg,
                             mask_id=MASK)
        for p in range(lp, lp + n_gen):
            assert (out[:, p] == f(p - 1)).all(), (alg, p)


@pytest.mark.parametrize("alg", CONF_ALGS)
@pytest.mark.parametrize("steps", [8, 4, 3])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_dream_confidence_algs_commit_counts(alg, steps, temperature):
    gen = 8
    toy = ToyLM(seed=20)
    prompt = make_prompt(batch=2, length=4)
    torch.manual_seed(1)
    out = dream_generate(toy.dream_fn, prompt, max_new_tokens=gen, steps=steps, alg=alg,
                         temperature=temperature, mask_id=MASK, forbid_mask_commit=True)
    assert len(toy.calls) == steps
    assert not (out == MASK).any()
    assert torch.equal(out[:, :4], prompt)
    canvases = toy.calls + [out]
    ts = torch.linspace(1, 1e-3, steps + 1)
    for i in range(steps):
        before, after = canvases[i], canvases[i + 1]
        was = before == MASK
        assert torch.equal(after[~was], before[~was])
        newly = (was & (after != MASK)).sum(dim=1)
        remaining = was.sum(dim=1)
        assert remaining[0] == remaining[1]  # lock-step
        if i == steps - 1:
            assert newly.tolist() == remaining.tolist()  # last step: everything left
        else:
            k = int(remaining.float().mean() * (1 - ts[i + 1] / ts[i]))
            assert newly.tolist() == [k, k]
    if steps == gen:
        assert torch.equal(canvases[1], canvases[0]), "step 0 commits nothing when steps == G"


@pytest.mark.parametrize("alg", DREAM_ALGS)
@pytest.mark.parametrize(
    "opts",
    [
        dict(temperature=0.0),
        dict(temperature=0.7),
        dict(temperature=0.7, top_p=0.9),
        dict(temperature=1.0, top_k=5),
        dict(temperature=0.5, top_p=0.8, top_k=10, alg_temp=0.5),
        dict(temperature=0.0, alg_temp=0.3),
    ],
    ids=["t0", "t07", "topp", "topk", "all", "algtemp"],
)
@pytest.mark.parametrize("steps", [12, 6, 1])
def test_dream_fills_everything_and_is_deterministic(alg, opts, steps):
    toy = ToyLM(seed=21)
    prompt = make_prompt(batch=2, length=4)
    torch.manual_seed(3)
    a = dream_generate(toy.dream_fn, prompt, max_new_tokens=12, steps=steps, alg=alg, mask_id=MASK,
                       forbid_mask_commit=True, **opts)
    torch.manual_seed(3)
    b = dream_generate(toy.dream_fn, prompt, max_new_tokens=12, steps=steps, alg=alg, mask_id=MASK,
                       **opts)
    assert torch.equal(a, b)
    assert not (a == MASK).any()
    assert a.shape == (2, 16)
    assert len(toy.calls) == 2 * steps


@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_dream_origin_rng_stream(temperature):
    """origin: per step rand(#masked) float32, then (T > 0) one multinomial over the chosen rows."""
    toy = ToyLM(seed=22)
    prompt = make_prompt(batch=2, length=3)
    torch.manual_seed(5)
    out = dream_generate(toy.dream_fn, prompt, max_new_tokens=10, steps=5, alg="origin",
                         temperature=temperature, mask_id=MASK)
    after = torch.rand(5)
    canvases = toy.calls + [out]
    torch.manual_seed(5)
    ts = torch.linspace(1, 1e-3, 6)
    for i in range(5):
        masked = canvases[i] == MASK
        r = torch.rand(int(masked.sum()))
        p = 1 - ts[i + 1] / ts[i] if i < 4 else 1
        go = r < p
        # the rows drawn are exactly the ones that got committed
        committed = masked & (canvases[i + 1] != MASK)
        assert int(go.sum()) == int(committed.sum())
        if temperature > 0 and int(go.sum()) > 0:
            logits = toy.logits(canvases[i])
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)[masked][go]
            probs = torch.softmax(logits / temperature, dim=-1)
            drawn = torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, True).T.reshape(-1)
            assert torch.equal(drawn, canvases[i + 1][committed])
    assert torch.equal(after, torch.rand(5))


def test_dream_confidence_algs_t0_draw_no_random_numbers():
    for alg in CONF_ALGS:
        toy = ToyLM(seed=23)
        torch.manual_seed(9)
        dream_generate(toy.dream_fn, make_prompt(), max_new_tokens=8, steps=8, alg=alg, mask_id=MASK)
        after = torch.rand(3)
        torch.manual_seed(9)
        assert torch.equal(after, torch.rand(3)), alg


def test_dream_t_positive_rng_stream_maskgit_plus_with_alg_temp():
    """Confidence algs at T > 0: multinomial over ALL masked rows, then multinomial(k) if alg_temp."""
    toy = ToyLM(seed=24)
    prompt = make_prompt(batch=2, length=3)
    steps, gen, temperature, alg_temp = 4, 8, 0.8, 0.5
    torch.manual_seed(2)
    out = dream_generate(toy.dream_fn, prompt, max_new_tokens=gen, steps=steps, alg="maskgit_plus",
                         temperature=temperature, alg_temp=alg_temp, mask_id=MASK)
    after = torch.rand(4)
    canvases = toy.calls + [out]
    ts = torch.linspace(1, 1e-3, steps + 1)
    torch.manual_seed(2)
    for i in range(steps):
        x = canvases[i]
        masked = x == MASK
        logits = toy.logits(x)
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)[masked]
        probs = torch.softmax(logits / temperature, dim=-1)
        tok = torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, True).T.reshape(-1)
        conf = probs.gather(-1, tok[:, None]).squeeze(-1)
        mean = masked.sum() / masked.shape[0]
        k = int(mean * (1 - ts[i + 1] / ts[i])) if i < steps - 1 else int(mean)
        full = torch.full(x.shape, -torch.inf)
        full[masked] = conf
        if k > 0:
            chosen = torch.multinomial(F.softmax(full / alg_temp, dim=-1), k)
            cand = torch.full_like(x, MASK)
            cand[masked] = tok
            expect = x.clone()
            rows = torch.arange(2)[:, None].expand_as(chosen)
            expect[rows, chosen] = cand[rows, chosen]
        else:
            expect = x
        assert torch.equal(expect, canvases[i + 1]), i
    assert torch.equal(after, torch.rand(4))


def test_dream_attention_mask_rules():
    toy = ToyLM(seed=25)
    prompt = make_prompt(batch=2, length=4)
    am = torch.ones(2, 4, dtype=torch.long)
    am[0, :2] = 0
    dream_generate(toy.dream_fn, prompt, attention_mask=am, max_new_tokens=3, steps=3,
                   alg="maskgit_plus", mask_id=MASK)
    mask4d, tok_idx = toy.extra[0]
    assert tok_idx.tolist() == [[1, 1, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6]]
    assert mask4d.dtype == torch.bool and mask4d.shape == (2, 1, 7, 7)
    keep = torch.tensor([0, 0, 1, 1, 1, 1, 1], dtype=torch.bool)
    assert torch.equal(mask4d[0, 0], keep[None, :] & keep[:, None])
    assert mask4d[1].all()
    # an all-ones mask is "full": no 4-D mask, default positions
    toy2 = ToyLM(seed=25)
    dream_generate(toy2.dream_fn, prompt, attention_mask=torch.ones(2, 4, dtype=torch.long),
                   max_new_tokens=3, steps=3, alg="maskgit_plus", mask_id=MASK)
    assert toy2.extra[0] == (None, None)


def test_dream_top_p_and_top_k_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = dream_top_p_logits(logits, 0.7) > torch.finfo(torch.float32).min
    assert kept.tolist() == [[True, True, False, False]]
    kept = dream_top_p_logits(logits, 0.4) > torch.finfo(torch.float32).min
    assert kept.tolist() == [[True, False, False, False]]
    # unsorted input
    perm = torch.tensor([2, 0, 3, 1])
    kept = dream_top_p_logits(logits[:, perm], 0.7) > torch.finfo(torch.float32).min
    assert kept.tolist() == [[False, True, False, True]]
    kept = dream_top_k_logits(logits, 3) > torch.finfo(torch.float32).min
    assert kept.tolist() == [[True, True, True, False]]
    assert torch.equal(dream_top_k_logits(logits, 100), logits)


def test_dream_sample_tokens_confidences():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, VOCAB, generator=g)
    probs = torch.softmax(logits, -1)
    c, t = dream_sample_tokens(logits)
    assert torch.equal(t, probs.argmax(-1)) and torch.equal(c, probs.max(-1).values)
    c, _ = dream_sample_tokens(logits, margin_confidence=True)
    top2 = probs.topk(2, dim=-1).values
    assert torch.equal(c, top2[:, 0] - top2[:, 1])
    c, _ = dream_sample_tokens(logits, neg_entropy=True)
    assert torch.equal(c, (probs * torch.log(probs + 1e-10)).sum(-1))
    assert (c < 0).all()


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_dream_top_p_1_and_top_k_none_are_noops(temperature):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(7, VOCAB, generator=g)
    torch.manual_seed(4)
    base = dream_sample_tokens(logits, temperature)
    for kw in (dict(top_p=1.0), dict(top_p=None, top_k=None), dict(top_k=VOCAB), dict(top_p=1.0, top_k=VOCAB)):
        torch.manual_seed(4)
        other = dream_sample_tokens(logits, temperature, **kw)
        assert torch.equal(base[0], other[0]) and torch.equal(base[1], other[1]), kw
    prompt = make_prompt()
    for alg in DREAM_ALGS:
        outs = []
        for kw in (dict(), dict(top_p=1.0), dict(top_k=None, top_p=None)):
            torch.manual_seed(8)
            outs.append(dream_generate(ToyLM(seed=26).dream_fn, prompt, max_new_tokens=8, steps=4,
                                       alg=alg, temperature=temperature, mask_id=MASK, **kw))
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), alg


def test_dream_forbid_mask_commit():
    toy = ToyLM(seed=27, allow_mask=True, boost={MASK: 50.0})
    prompt = make_prompt(batch=1)
    for alg in DREAM_ALGS:
        out = dream_generate(toy.dream_fn, prompt, max_new_tokens=4, steps=4, alg=alg, mask_id=MASK)
        assert (out[:, prompt.shape[1]:] == MASK).all()
        with pytest.raises(MaskCommitError):
            dream_generate(toy.dream_fn, prompt, max_new_tokens=4, steps=4, alg=alg, mask_id=MASK,
                           forbid_mask_commit=True)


# ----------------------------------------------------------------------------------------------
# Fast-dLLM's Dream confidence_threshold and the KLASS authors' decoder
# ----------------------------------------------------------------------------------------------


def _masks_per_call(toy, out):
    return [int((c == MASK).sum()) for c in toy.calls] + [int((out == MASK).sum())]


@pytest.mark.parametrize("gen,steps", [(12, 4), (12, 3), (8, 8)])
def test_fastdllm_dream_quota_when_everything_passes_the_threshold(gen, steps):
    from .decoders.fastdllm_dream_generate import fastdllm_dream_threshold_generate

    toy = ToyLM(seed=2)
    out, nfe = fastdllm_dream_threshold_generate(toy.dream_fn, make_prompt(batch=1), max_new_tokens=gen,
                                                 steps=steps, threshold=1e-9, mask_id=MASK)
    assert nfe == steps == len(toy.calls)
    assert _masks_per_call(toy, out) == [gen - i * (gen // steps) for i in range(steps + 1)]


def test_fastdllm_dream_carries_rejects_and_extends_the_steps():
    from .decoders.fastdllm_dream_generate import fastdllm_dream_threshold_generate

    toy = ToyLM(seed=2)  # scale 4: no probability reaches 1, so only rank 0 passes threshold 1.0
    out, nfe = fastdllm_dream_threshold_generate(toy.dream_fn, make_prompt(batch=1), max_new_tokens=12,
                                                 steps=3, threshold=1.0, mask_id=MASK)
    assert nfe == 12 and _masks_per_call(toy, out) == list(range(12, -1, -1))  # one per step, 9 extra steps
    with pytest.raises(AssertionError):
        fastdllm_dream_threshold_generate(toy.dream_fn, make_prompt(batch=1), max_new_tokens=10, steps=3,
                                          mask_id=MASK)  # 10 masks are no multiple of 3


@pytest.mark.parametrize("history", [1, 2, 3])
def test_klass_later_blocks_are_ready_one_step_earlier(history):
    """No bar (tau_conf 0, kappa 15: above any KL between two steps of the toy, below the KL
    against the zero-initialised ``p_prev``, log(1e12) minus the entropy): the first block is ready
    at its step H, later blocks at step H - 1 (their step-0 KL compares with the previous block's
    last step)."""
    from .decoders.klass_generate import klass_generate

    toy = ToyLM(seed=3)
    _, forwards = klass_generate(lambda x: toy.llada_fn(x, None), make_prompt(batch=1), gen_length=18, steps=18,
                                 block_length=6, mask_id=MASK, conf_threshold=0.0, kl_threshold=15.0,
                                 kl_history_length=history)
    assert forwards == (history + 1) + 2 * history


def test_klass_without_stable_positions_is_one_token_per_step():
    from .decoders.klass_generate import klass_generate

    toy = ToyLM(seed=3)
    out, forwards = klass_generate(lambda x: toy.llada_fn(x, None), make_prompt(batch=1), gen_length=12, steps=12,
                                   block_length=4, mask_id=MASK, conf_threshold=0.99, kl_threshold=1e-9)
    assert forwards == 12 and _masks_per_call(toy, out) == list(range(12, -1, -1))
