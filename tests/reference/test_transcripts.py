"""Sanity tests of the reference transcripts themselves (no dependency on ``dllm``).

The references are driven by a toy ``model_fn``: a fixed random map from (token, position, mean
context) to logits, which records every canvas it is called on.  The tests check the structural
properties the original samplers are known to have (from their source), the exact random-number
streams they consume, and a few hand-checkable cases (schedule values, the Dream shift, top-p).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .decoders.dream_generate import dream_generate, dream_sample_tokens, dream_top_k_logits, dream_top_p_logits
from .decoders.llada_generate import (
    AmbiguousTieError,
    MaskCommitError,
    ambiguous_topk,
    llada_generate,
    llada_transfer_schedule,
)

VOCAB = 40
MASK = 39
EOS = 3
EOT = 4


class ToyLM:
    """Deterministic toy model: logits depend on the token, its position and the mean context.

    ``boost`` adds a constant to given vocabulary columns (e.g. to make EOS likely).  The mask
    column gets -1e4 unless ``allow_mask`` so the references never propose the mask id.
    ``context=False`` makes the logits depend on the position only (then CFG is a no-op).
    Every input canvas is recorded in ``calls`` (a clone).
    """

    def __init__(self, seed=0, vocab=VOCAB, dim=16, mask_id=MASK, boost=None, allow_mask=False,
                 context=True, scale=4.0):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(vocab, dim, generator=g)
        self.pos = torch.randn(512, dim, generator=g)
        self.out = torch.randn(dim, vocab, generator=g) / dim**0.5
        self.mask_id = mask_id
        self.boost = boost or {}
        self.allow_mask = allow_mask
        self.context = context
        self.scale = scale
        self.calls: list[torch.Tensor] = []
        self.extra: list[tuple] = []

    def logits(self, x, positions=None):
        b, n = x.shape
        if positions is None:
            positions = torch.arange(n).expand(b, n)
        h = self.pos[positions]
        if self.context:
            e = self.emb[x]
            h = h + e + e.mean(dim=1, keepdim=True)
        out = torch.tanh(h) @ self.out * self.scale
        for col, val in self.boost.items():
            out[:, :, col] += val
        if not self.allow_mask:
            out[:, :, self.mask_id] = -1e4
        return out

    def llada_fn(self, x, attention_mask):
        self.calls.append(x.clone())
        self.extra.append((attention_mask,))
        return self.logits(x)

    def dream_fn(self, x, attention_mask, tok_idx):
        self.calls.append(x.clone())
        self.extra.append((attention_mask, tok_idx))
        return self.logits(x, tok_idx)


def make_prompt(batch=2, length=5, seed=123):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, MASK, (batch, length), generator=g)  # no specials, no mask


def expected_schedule(masks, steps):
    return [masks // steps + (1 if i < masks % steps else 0) for i in range(steps)]


# ----------------------------------------------------------------------------------------------
# LLaDA
# ----------------------------------------------------------------------------------------------


def test_llada_schedule_values():
    def one(m, s):
        return llada_transfer_schedule(torch.arange(32).unsqueeze(0) < m, s)[0].tolist()

    assert one(32, 8) == [4] * 8
    assert one(32, 5) == [7, 7, 6, 6, 6]
    assert one(32, 32) == [1] * 32
    assert one(5, 8) == [1, 1, 1, 1, 1, 0, 0, 0]
    rows = torch.zeros(2, 8, dtype=torch.bool)
    rows[0, :8] = True
    rows[1, :3] = True
    sched = llada_transfer_schedule(rows, 3)
    assert sched.tolist() == [[3, 3, 2], [1, 1, 1]]
    assert sched.dtype == torch.int64


LLADA_SHAPES = [(16, 8, 8), (16, 16, 16), (12, 4, 6), (16, 16, 5), (8, 8, 3), (12, 6, 4)]


@pytest.mark.parametrize("gen,block,steps", LLADA_SHAPES)
@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("cfg", [0.0, 0.5])
def test_llada_commits_follow_schedule(gen, block, steps, remasking, temperature, cfg):
    toy = ToyLM(seed=1)
    prompt = make_prompt(batch=2, length=5)
    torch.manual_seed(0)
    out = llada_generate(toy.llada_fn, prompt, steps=steps, gen_length=gen, block_length=block,
                         temperature=temperature, cfg_scale=cfg, remasking=remasking, mask_id=MASK,
                         forbid_mask_commit=True)
    batch, lp = prompt.shape
    assert out.shape == (batch, lp + gen)
    assert torch.equal(out[:, :lp], prompt)
    assert not (out == MASK).any(), "all masks must be filled"
    assert len(toy.calls) == steps  # NFE == steps
    canvases = [c[:batch] for c in toy.calls] + [out]
    if cfg > 0:
        for c in toy.calls:
            assert c.shape[0] == 2 * batch
            assert (c[batch:, :lp] == MASK).all()  # unconditional copy: prompt -> mask
            assert torch.equal(c[batch:, lp:], c[:batch, lp:])
    num_blocks = gen // block
    per_block = steps // num_blocks
    sched = expected_schedule(block, per_block)
    for k in range(steps):
        before, after = canvases[k], canvases[k + 1]
        b, i = divmod(k, per_block)
        start, end = lp + b * block, lp + (b + 1) * block
        was_masked = before == MASK
        newly = was_masked & (after != MASK)
        # committed tokens never change
        assert torch.equal(after[~was_masked], before[~was_masked])
        # exactly n[j, i] commits per row, all inside the current block
        assert newly.sum(dim=1).tolist() == [sched[i]] * batch
        assert not newly[:, :start].any() and not newly[:, end:].any()
        if i == per_block - 1:
            assert not (after[:, start:end] == MASK).any(), "block filled at its last step"


def test_llada_first_step_is_greedy_low_confidence():
    toy = ToyLM(seed=2)
    prompt = make_prompt(batch=2, length=4)
    gen, block, steps = 8, 4, 4  # 2 commits per step
    out = llada_generate(toy.llada_fn, prompt, steps=steps, gen_length=gen, block_length=block,
                         mask_id=MASK)
    after = toy.calls[1]
    logits = toy.logits(toy.calls[0])
    probs = F.softmax(logits, dim=-1)
    conf, tok = probs.max(dim=-1)
    lp = prompt.shape[1]
    for j in range(2):
        order = torch.argsort(conf[j, lp:lp + block], descending=True)[:2] + lp
        committed = ((toy.calls[0][j] == MASK) & (after[j] != MASK)).nonzero().flatten()
        assert sorted(order.tolist()) == sorted(committed.tolist())
        assert torch.equal(after[j, committed], tok[j, committed])
    assert not (out == MASK).any()


def test_llada_t0_low_confidence_draws_no_random_numbers():
    toy = ToyLM(seed=3)
    torch.manual_seed(7)
    llada_generate(toy.llada_fn, make_prompt(), steps=8, gen_length=8, block_length=4, mask_id=MASK)
    after = torch.rand(4)
    torch.manual_seed(7)
    assert torch.equal(after, torch.rand(4))


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("cfg", [0.0, 0.5])
def test_llada_rng_stream(remasking, temperature, cfg):
    """Per step: rand float64 [B, L, V] (T > 0, after CFG) then rand float32 [B, L] (random)."""
    toy = ToyLM(seed=4)
    prompt = make_prompt(batch=2, length=3)
    gen, steps = 8, 4
    torch.manual_seed(11)
    llada_generate(toy.llada_fn, prompt, steps=steps, gen_length=gen, block_length=4,
                   temperature=temperature, cfg_scale=cfg, remasking=remasking, mask_id=MASK)
    after = torch.rand(5)
    torch.manual_seed(11)
    b, length = prompt.shape[0], prompt.shape[1] + gen
    for _ in range(steps):
        if temperature > 0:
            torch.rand(b, length, VOCAB, dtype=torch.float64)
        if remasking == "random":
            torch.rand(b, length)
    assert torch.equal(after, torch.rand(5))


def test_llada_gumbel_noise_values_match_manual_draw():
    """At T > 0, step 0's proposal is argmax(exp(l64) / (-log U)^T) with U = rand_like(l64)."""
    toy = ToyLM(seed=5)
    prompt = make_prompt(batch=1, length=4)
    temperature = 0.7
    torch.manual_seed(21)
    llada_generate(toy.llada_fn, prompt, steps=4, gen_length=4, block_length=4,
                   temperature=temperature, mask_id=MASK)
    torch.manual_seed(21)
    l64 = toy.logits(toy.calls[0]).to(torch.float64)
    u = torch.rand_like(l64)
    proposal = (l64.exp() / (-torch.log(u)) ** temperature).argmax(-1)
    probs = F.softmax(toy.logits(toy.calls[0]), dim=-1)
    conf = probs.gather(-1, proposal.unsqueeze(-1)).squeeze(-1)
    conf[:, :4] = -torch.inf
    pos = int(conf[0].argmax())
    assert toy.calls[1][0, pos] == proposal[0, pos]
    assert int((toy.calls[1] != MASK).sum()) == 4 + 1


def test_llada_random_remasking_deterministic_under_manual_seed():
    toy = ToyLM(seed=6)
    prompt = make_prompt()
    kw = dict(steps=8, gen_length=16, block_length=8, remasking="random", mask_id=MASK)
    outs = []
    for seed in (0, 0, 1, 2, 3):
        torch.manual_seed(seed)
        outs.append(llada_generate(toy.llada_fn, prompt, **kw))
    assert torch.equal(outs[0], outs[1])
    assert any(not torch.equal(outs[0], o) for o in outs[2:])
    for temperature in (0.0, 1.0):
        torch.manual_seed(5)
        a = llada_generate(toy.llada_fn, prompt, temperature=temperature, **kw)
        torch.manual_seed(5)
        b = llada_generate(toy.llada_fn, prompt, temperature=temperature, **kw)
        assert torch.equal(a, b)


def test_llada_cfg_combination():
    # context-free logits: conditional == unconditional, so CFG changes nothing.
    flat = ToyLM(seed=7, context=False)
    prompt = make_prompt()
    kw = dict(steps=8, gen_length=8, block_length=8, mask_id=MASK)
    assert torch.equal(llada_generate(flat.llada_fn, prompt, cfg_scale=2.0, **kw),
                       llada_generate(flat.llada_fn, prompt, **kw))
    # one step, one token: the committed token is argmax(un + (s + 1)(c - un)).
    toy = ToyLM(seed=8)
    prompt = make_prompt(batch=2, length=4)
    out = llada_generate(toy.llada_fn, prompt, steps=1, gen_length=1, block_length=1,
                         cfg_scale=1.5, mask_id=MASK)
    both = toy.calls[0]
    cond, uncond = toy.logits(both).chunk(2, dim=0)
    guided = uncond + 2.5 * (cond - uncond)
    assert torch.equal(out[:, -1], guided[:, -1].argmax(-1))
    assert toy.extra[0][0] is None


def test_llada_attention_mask_is_extended_and_doubled():
    toy = ToyLM(seed=9)
    prompt = make_prompt(batch=2, length=4)
    am = torch.ones(2, 4, dtype=torch.long)
    am[1, 0] = 0
    llada_generate(toy.llada_fn, prompt, attention_mask=am, steps=2, gen_length=4, block_length=4,
                   mask_id=MASK)
    seen = toy.extra[0][0]
    assert seen.shape == (2, 8) and seen[1, 0] == 0 and (seen[:, 4:] == 1).all()
    toy2 = ToyLM(seed=9)
    llada_generate(toy2.llada_fn, prompt, attention_mask=am, steps=2, gen_length=4, block_length=4,
                   mask_id=MASK, cfg_scale=0.5)
    assert toy2.extra[0][0].shape == (4, 8)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_llada_logits_eos_inf_bans_eos(temperature):
    prompt = make_prompt()
    kw = dict(steps=16, gen_length=16, block_length=8, temperature=temperature, mask_id=MASK,
              eos_id=EOS, eot_id=EOT)
    toy = ToyLM(seed=10, boost={EOS: 3.0})
    torch.manual_seed(0)
    plain = llada_generate(toy.llada_fn, prompt, **kw)
    assert (plain == EOS).any(), "precondition: EOS is likely under this toy"
    torch.manual_seed(0)
    banned = llada_generate(toy.llada_fn, prompt, logits_eos_inf=True, **kw)
    assert not (banned == EOS).any()


def test_llada_confidence_eos_eot_inf_commits_eos_last_at_t0():
    toy = ToyLM(seed=13, boost={EOS: 4.0, EOT: 4.0})
    prompt = make_prompt()
    gen = 16
    kw = dict(steps=gen, gen_length=gen, block_length=8, mask_id=MASK, eos_id=EOS, eot_id=EOT)
    out = llada_generate(toy.llada_fn, prompt, confidence_eos_eot_inf=True, **kw)
    plain = llada_generate(ToyLM(seed=13, boost={EOS: 4.0, EOT: 4.0}).llada_fn, prompt, **kw)
    assert ((plain == EOS) | (plain == EOT)).any(), "precondition: EOS/EoT are proposed"
    assert not torch.equal(out, plain), "the option must matter under this toy"
    canvases = toy.calls + [out]
    lp = prompt.shape[1]
    special = 0
    for k in range(gen):
        before, after = canvases[k], canvases[k + 1]
        b = k // 8
        start, end = lp + 8 * b, lp + 8 * (b + 1)
        proposal = toy.logits(before).argmax(-1)
        for j in range(before.shape[0]):
            cand = (before[j] == MASK).nonzero().flatten()
            cand = cand[(cand >= start) & (cand < end)]
            committed = ((before[j] == MASK) & (after[j] != MASK)).nonzero().flatten()
            assert committed.numel() == 1
            tok = int(after[j, committed[0]])
            assert tok == int(proposal[j, committed[0]])
            ordinary = [int(p) for p in cand if int(proposal[j, p]) not in (EOS, EOT)]
            if ordinary:
                assert tok not in (EOS, EOT), "EOS/EoT proposals must have confidence 0"
            else:
                special += 1
    assert special > 0, "precondition: some step had only EOS/EoT proposals"


def test_llada_eos_bug_only_at_positive_temperature():
    prompt = make_prompt()
    kw = dict(steps=16, gen_length=16, block_length=16, mask_id=MASK, eos_id=EOS, eot_id=EOT,
              confidence_eos_eot_inf=True)
    boost = {EOS: 4.0, EOT: 1.0}
    # T == 0: the noisy tensor aliases the logits, so the bug has no effect.
    a = llada_generate(ToyLM(seed=13, boost=boost).llada_fn, prompt, **kw)
    b = llada_generate(ToyLM(seed=13, boost=boost).llada_fn, prompt, fix_eos_bug=True, **kw)
    assert torch.equal(a, b)
    # T > 0: the EOS write is lost without the fix; outputs differ for some seed.
    differs = False
    for seed in range(10):
        torch.manual_seed(seed)
        a = llada_generate(ToyLM(seed=13, boost=boost).llada_fn, prompt, temperature=1.0, **kw)
        torch.manual_seed(seed)
        b = llada_generate(ToyLM(seed=13, boost=boost).llada_fn, prompt, temperature=1.0,
                           fix_eos_bug=True, **kw)
        differs |= not torch.equal(a, b)
    assert differs


def test_llada_forbid_mask_commit_raises_and_default_leaves_mask():
    toy = ToyLM(seed=13, allow_mask=True, boost={MASK: 50.0})
    prompt = make_prompt(batch=1)
    out = llada_generate(toy.llada_fn, prompt, steps=4, gen_length=4, block_length=4, mask_id=MASK)
    assert (out[:, prompt.shape[1]:] == MASK).all()  # the original leaves such positions masked
    with pytest.raises(MaskCommitError):
        llada_generate(toy.llada_fn, prompt, steps=4, gen_length=4, block_length=4, mask_id=MASK,
                       forbid_mask_commit=True)


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
# tie detection (forbid_ties)
# ----------------------------------------------------------------------------------------------


def test_ambiguous_topk():
    v = torch.tensor([0.5, 0.9, 0.5, 0.1])
    assert not ambiguous_topk(v, torch.tensor([1]))
    assert ambiguous_topk(v, torch.tensor([1, 0]))  # 0.5 also at index 2, unchosen
    assert not ambiguous_topk(v, torch.tensor([1, 0, 2]))  # both 0.5 chosen
    assert not ambiguous_topk(v, torch.tensor([], dtype=torch.long))
    w = torch.tensor([0.3, -torch.inf, -torch.inf])
    assert ambiguous_topk(w, torch.tensor([0, 1]))  # a -inf filler pick


def test_forbid_ties_detects_degenerate_confidences():
    # position-only logits with a huge margin: every masked position has probability ~1 -> ties
    def flat_fn(x, am=None, tok_idx=None):
        logits = torch.zeros(x.shape[0], x.shape[1], VOCAB)
        logits[:, :, 7] = 1e4
        return logits

    prompt = make_prompt(batch=1)
    out = llada_generate(flat_fn, prompt, steps=4, gen_length=8, block_length=8, mask_id=MASK)
    assert (out[:, prompt.shape[1]:] == 7).all()
    with pytest.raises(AmbiguousTieError):
        llada_generate(flat_fn, prompt, steps=4, gen_length=8, block_length=8, mask_id=MASK,
                       forbid_ties=True)
    with pytest.raises(AmbiguousTieError):
        dream_generate(flat_fn, prompt, max_new_tokens=8, steps=4, alg="maskgit_plus", mask_id=MASK,
                       forbid_ties=True)
    # alg_temp > 0 samples positions (no top-k), so no tie check applies
    dream_generate(flat_fn, prompt, max_new_tokens=8, steps=4, alg="maskgit_plus", alg_temp=0.5,
                   mask_id=MASK, forbid_ties=True)
    # the toy model has no exact ties: forbid_ties never fires and changes nothing
    toy = ToyLM(seed=30)
    a = llada_generate(toy.llada_fn, prompt, steps=8, gen_length=8, block_length=8, mask_id=MASK)
    b = llada_generate(toy.llada_fn, prompt, steps=8, gen_length=8, block_length=8, mask_id=MASK,
                       forbid_ties=True)
    assert torch.equal(a, b)


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
