"""Sanity tests of the reference transcripts themselves (no dependency on ``dllm``): LLaDA's ``generate`` and the tie detection of both.

The references are driven by a toy ``model_fn`` (``toy.ToyLM``), which records every canvas it is
called on. The tests check the structural properties the original samplers are known to have (from
their source), the exact random-number streams they consume, and a few hand-checkable cases (schedule values).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .decoders.dream_generate import dream_generate
from .decoders.llada_generate import (
    AmbiguousTieError,
    MaskCommitError,
    ambiguous_topk,
    llada_generate,
    llada_transfer_schedule,
)
from .toy import EOS, EOT, MASK, VOCAB, ToyLM, expected_schedule, make_prompt


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
