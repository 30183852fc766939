"""Token-exact equality of ``dllm.generate`` with the reference samplers.

References: ``tests/reference/decoders/llada_generate.py`` (LLaDA HEAD ``generate()``) and
``tests/reference/decoders/dream_generate.py`` (Dream ``_sample``), both on the same tiny float32 random
models ``dllm.models.tiny`` (float32, where equal confidences are rare; the peaked variants of
``test_reference_ties.py`` make them common).

Assumptions about ``dllm`` that these tests encode (see also ``tests/reference/decoders/__init__.py``):

* ``model.raw_logits(x, positions=None, key_padding_mask=None)`` is the official forward
  (unshifted); with no padding the default positions are ``arange``.  The LLaDA reference gets
  ``raw_logits(x)``; the Dream reference gets ``raw_logits(x, positions=tok_idx)`` and applies the
  shift itself.
* ``dllm.generate(..., seed=s)`` draws every random number from a private
  ``torch.Generator().manual_seed(s)`` in the same order, shapes and dtypes as the reference does
  on the global generator after ``torch.manual_seed(s)``:

  - LLaDA (``low_confidence`` / ``random``), per step: if T > 0 one float64 uniform tensor of shape
    [B, L, V] (full canvas, after the CFG combination, i.e. batch B not 2B) used as
    ``argmax(exp(l64) / (-log U) ** T)``; then for ``random`` one float32 ``rand((B, L))``.
    Nothing at T == 0 with ``low_confidence``.
  - Dream ``origin``, per step: float32 ``rand(#masked in the whole batch)`` (also at T == 0), then
    at T > 0 one ``multinomial(probs / probs.sum(-1, keepdim=True), 1, replacement=True)`` over
    the rows selected for transfer (row-major over the batch; nothing when none is selected).
  - Dream confidence algorithms, per step: at T > 0 that multinomial over ALL masked rows; then,
    if ``alg_temp`` > 0 and k > 0, ``multinomial(softmax(C / alg_temp), k)`` without replacement
    on the [B, N] confidence matrix (-inf outside the masked positions).

* ``confidence_eos_eot_inf`` at T > 0: dllm applies the fix of ML-GSAI/LLaDA#137, so it is
  compared with the reference run with ``fix_eos_bug=True``.  At T == 0 the bug is inert.
* EOS / EoT ids come from ``model.eos_id`` / ``model.eot_id`` (EoT falls back to EOS when the
  model has none, which is what removing "EOS and EoT" means then).  The EOS-option cases use the
  same tiny LLaDA weights with ``tiny(..., eos_id=, eot_id=)`` pointing at tokens the model often
  proposes, and prefer a seed for which the option changes the reference output.
* NFE: ``out.nfe == steps`` for LLaDA without CFG and for Dream.  Under CFG the reference does one
  forward on a doubled batch per step; how dllm counts that is not asserted here.

The reference leaves a position masked when it commits a proposal that IS the mask id; dllm never
proposes the mask id.  The references are therefore run with ``forbid_mask_commit=True``, and each
case picks the first seed (which also picks the prompt) for which that does not happen.  The
parametrised cases also use ``forbid_ties=True`` (no top-k cut among equal confidences), so they
test everything but tie handling; ties have their own tests (``*_peaked_ties_*``): on a model whose
logits are scaled up, the softmax saturates to exactly 1.0 and the reference's ``torch.topk``
decides among equal confidences, which dllm reproduces by making the same ``torch.topk`` call.
"""

from __future__ import annotations

import pytest
import torch
from reference_cases import (DREAM_PROMPT_LEN, LLADA_PROMPT_LEN, REJECT, SHAPES, assert_no_mask, dream_model_fn,
                             eos_eot, eos_model, model_of, pick_seed, prompt_of)

from tests.reference.decoders.dream_generate import dream_generate
from tests.reference.decoders.llada_generate import llada_generate


# ----------------------------------------------------------------------------------------------
# LLaDA
# ----------------------------------------------------------------------------------------------

LLADA_CASES = []
for _shape in SHAPES:
    for _rem in ("low_confidence", "random"):
        for _temp in (0.0, 0.8):
            LLADA_CASES.append(pytest.param(_rem, _shape, _temp, 0.0, {}, 1,
                                            id=f"{_rem}-{_shape}-T{_temp}"))
LLADA_CASES += [
    # batch 2, equal-length prompts
    pytest.param("low_confidence", "g16b8s8", 0.0, 0.0, {}, 2, id="low_confidence-b2-T0"),
    pytest.param("low_confidence", "g12b4s6", 1.0, 0.0, {}, 2, id="low_confidence-b2-T1"),
    pytest.param("random", "g16b8s8", 0.0, 0.0, {}, 2, id="random-b2-T0"),
    pytest.param("random", "g16b16s5", 0.7, 0.0, {}, 2, id="random-b2-T0.7"),
    # classifier-free guidance
    pytest.param("low_confidence", "g16b8s8", 0.0, 0.5, {}, 1, id="cfg0.5-low_confidence-T0"),
    pytest.param("low_confidence", "g12b4s6", 0.8, 0.5, {}, 2, id="cfg0.5-low_confidence-b2-T0.8"),
    pytest.param("random", "g16b8s8", 0.8, 0.5, {}, 1, id="cfg0.5-random-T0.8"),
    # EOS options
    pytest.param("low_confidence", "g16b8s8", 0.0, 0.0, {"logits_eos_inf": True}, 1, id="eosinf-T0"),
    pytest.param("low_confidence", "g16b8s8", 0.8, 0.0, {"logits_eos_inf": True}, 2, id="eosinf-b2-T0.8"),
    pytest.param("random", "g16b16s16", 0.8, 0.0, {"logits_eos_inf": True}, 1, id="eosinf-random-T0.8"),
    pytest.param("low_confidence", "g16b8s8", 0.0, 0.0, {"confidence_eos_eot_inf": True}, 1,
                 id="confeos-T0"),
    pytest.param("low_confidence", "g16b16s16", 1.0, 0.0, {"confidence_eos_eot_inf": True}, 2,
                 id="confeos-b2-T1-fixed-bug"),
    pytest.param("random", "g12b4s6", 0.8, 0.0, {"confidence_eos_eot_inf": True}, 1,
                 id="confeos-random-T0.8"),
    pytest.param("low_confidence", "g16b8s8", 0.8, 0.0,
                 {"logits_eos_inf": True, "confidence_eos_eot_inf": True}, 1, id="both-eos-T0.8"),
    pytest.param("low_confidence", "g16b8s8", 0.0, 0.5, {"confidence_eos_eot_inf": True}, 1,
                 id="confeos-cfg0.5-T0"),
]


def _llada_reference(model, prompt, seed, remasking, gen, block, steps, temperature, cfg, options):
    eos, eot = eos_eot(model)
    torch.manual_seed(seed)
    return llada_generate(
        lambda x, attention_mask: model.raw_logits(x),
        prompt,
        steps=steps,
        gen_length=gen,
        block_length=block,
        temperature=temperature,
        cfg_scale=cfg,
        remasking=remasking,
        mask_id=int(model.mask_id),
        logits_eos_inf=bool(options.get("logits_eos_inf", False)),
        confidence_eos_eot_inf=bool(options.get("confidence_eos_eot_inf", False)),
        eos_id=eos,
        eot_id=eot,
        fix_eos_bug=True,  # dllm fixes ML-GSAI/LLaDA#137 (inert at T == 0)
        forbid_mask_commit=True,
        forbid_ties=True,
    )


@pytest.mark.parametrize("remasking,shape,temperature,cfg,options,batch", LLADA_CASES)
def test_llada_equals_reference(remasking, shape, temperature, cfg, options, batch):
    import dllm

    model = eos_model() if options else model_of("llada")
    gen, block, steps = SHAPES[shape]

    def run_ref(seed, opts=options):
        prompt = prompt_of(model, batch, LLADA_PROMPT_LEN, seed)
        return _llada_reference(model, prompt, seed, remasking, gen, block, steps, temperature,
                                cfg, opts)

    prefer = None
    # (confidence_eos_eot_inf alone is a no-op under random remasking: confidences are random)
    if options.get("logits_eos_inf") or (options and remasking == "low_confidence"):
        # prefer a seed for which the option changes the reference output (so the test has teeth)
        def prefer(seed, ref):
            try:
                return not torch.equal(ref, run_ref(seed, {}))
            except REJECT:
                return False

    seed, ref = pick_seed(run_ref, prefer)
    assert_no_mask(model, ref, LLADA_PROMPT_LEN)
    prompt = prompt_of(model, batch, LLADA_PROMPT_LEN, seed)

    out = dllm.generate(
        model,
        prompt,
        sampler=remasking,
        gen_length=gen,
        block_length=block,
        steps=steps,
        temperature=temperature,
        cfg_scale=cfg,
        seed=seed,
        **{k: v for k, v in options.items() if v},
    )
    assert out.sequences.shape == ref.shape
    assert torch.equal(out.sequences, ref), (
        f"seed {seed}\nref  {ref.tolist()}\ndllm {out.sequences.tolist()}"
    )
    if cfg == 0.0:
        assert out.nfe == steps


def test_llada_eos_bug_is_fixed_in_dllm():
    """At T > 0 with ``confidence_eos_eot_inf`` dllm follows the FIXED reference (ML-GSAI/LLaDA#137).

    Finds a seed where the buggy and the fixed reference differ, then checks dllm equals the fixed
    one (and therefore not the buggy one).  Skipped when no candidate seed shows the difference.
    """
    import dllm

    model = eos_model()
    eos, eot = eos_eot(model)
    for seed in range(8):
        prompt = prompt_of(model, 1, LLADA_PROMPT_LEN, seed)
        outs = []
        try:
            for fix in (False, True):
                torch.manual_seed(seed)
                outs.append(llada_generate(lambda x, am: model.raw_logits(x), prompt, steps=16,
                                           gen_length=16, block_length=16, temperature=1.0,
                                           mask_id=int(model.mask_id), confidence_eos_eot_inf=True,
                                           eos_id=eos, eot_id=eot, fix_eos_bug=fix,
                                           forbid_mask_commit=True, forbid_ties=True))
        except REJECT:
            continue
        if torch.equal(*outs):
            continue
        out = dllm.generate(model, prompt, sampler="low_confidence", gen_length=16, block_length=16,
                            steps=16, temperature=1.0, seed=seed, confidence_eos_eot_inf=True)
        assert torch.equal(out.sequences, outs[1]), f"seed {seed}: dllm != fixed reference"
        assert not torch.equal(out.sequences, outs[0])
        return
    pytest.skip("no candidate seed makes the buggy and the fixed reference differ on this model")


# ----------------------------------------------------------------------------------------------
# Dream
# ----------------------------------------------------------------------------------------------

DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")

# name -> (temperature, sampler options).  Exact ties are frequent on the tiny model once top-p
# leaves a single token (probability exactly 1); such variants would only find tie-free seeds by
# luck, so the confidence algorithms use milder filters ("origin" has no top-k selection).
DREAM_VARIANTS = {
    "T0": (0.0, {}),
    "T0.7-topp0.9": (0.7, {"top_p": 0.9}),
    "T1-topp0.95": (1.0, {"top_p": 0.95}),
    "T1-topk8": (1.0, {"top_k": 8}),
    "T1.5-topp0.95-topk20": (1.5, {"top_p": 0.95, "top_k": 20}),
    "T0.7-algtemp0.5": (0.7, {"alg_temp": 0.5}),
    "T0.5-topp0.8-topk10-algtemp0.5": (0.5, {"top_p": 0.8, "top_k": 10, "alg_temp": 0.5}),
    "T0-algtemp0.3": (0.0, {"alg_temp": 0.3}),
}
_ORIGIN_ONLY = {"T0.7-topp0.9"}

# (gen_length, steps)
DREAM_SHAPES = {"g16s16": (16, 16), "g16s8": (16, 8), "g12s5": (12, 5)}

DREAM_CASES = []
for _alg in DREAM_ALGS:
    for _variant in DREAM_VARIANTS:
        if _alg == "origin" and "algtemp" in _variant:
            continue  # alg_temp only acts on the confidence algorithms
        if _alg != "origin" and _variant in _ORIGIN_ONLY:
            continue
        for _shape in ("g16s16", "g16s8"):
            DREAM_CASES.append(pytest.param(_alg, _variant, _shape, 1, id=f"{_alg}-{_variant}-{_shape}"))
for _alg in DREAM_ALGS:
    DREAM_CASES.append(pytest.param(_alg, "T0", "g12s5", 2, id=f"{_alg}-T0-g12s5-b2"))
    DREAM_CASES.append(pytest.param(_alg, "T1-topp0.95", "g12s5", 2, id=f"{_alg}-T1-topp0.95-g12s5-b2"))


def _dream_reference(model, prompt, seed, alg, gen, steps, temperature, options, attention_mask=None):
    torch.manual_seed(seed)
    return dream_generate(
        dream_model_fn(model),
        prompt,
        attention_mask=attention_mask,
        max_new_tokens=gen,
        steps=steps,
        temperature=temperature,
        top_p=options.get("top_p"),
        top_k=options.get("top_k"),
        alg=alg,
        alg_temp=options.get("alg_temp"),
        eps=options.get("eps", 1e-3),
        mask_id=int(model.mask_id),
        forbid_mask_commit=True,
        forbid_ties=True,
    )


@pytest.mark.parametrize("alg,variant,shape,batch", DREAM_CASES)
def test_dream_equals_reference(alg, variant, shape, batch):
    import dllm

    model = model_of("dream")
    gen, steps = DREAM_SHAPES[shape]
    temperature, options = DREAM_VARIANTS[variant]

    def run_ref(seed):
        prompt = prompt_of(model, batch, DREAM_PROMPT_LEN, seed)
        return _dream_reference(model, prompt, seed, alg, gen, steps, temperature, options)

    seed, ref = pick_seed(run_ref)
    assert_no_mask(model, ref, DREAM_PROMPT_LEN)
    prompt = prompt_of(model, batch, DREAM_PROMPT_LEN, seed)

    out = dllm.generate(
        model,
        prompt,
        sampler=alg,
        gen_length=gen,
        steps=steps,
        temperature=temperature,
        seed=seed,
        **options,
    )
    assert out.sequences.shape == ref.shape
    assert torch.equal(out.sequences, ref), (
        f"seed {seed}\nref  {ref.tolist()}\ndllm {out.sequences.tolist()}"
    )
    assert out.nfe == steps


@pytest.mark.parametrize("alg", DREAM_ALGS)
def test_dream_left_padded_batch_equals_reference(alg):
    """Unequal prompts: Dream's tok_idx / 4-D mask vs dllm's explicit positions + key padding.

    Real positions get the same positions and the same attention in both (pads only differ in
    their own rows and in the position of pads: 1 in Dream, 0 in dllm), so the tokens must match.
    """
    import dllm

    model = model_of("dream")
    gen, steps = 12, 6
    pad = int(model.pad_id if model.pad_id is not None else model.eos_id)

    def build(seed):
        long_row = prompt_of(model, 1, DREAM_PROMPT_LEN, seed)[0]
        short_row = prompt_of(model, 1, DREAM_PROMPT_LEN - 2, seed + 100)[0]
        padded = torch.stack([long_row, torch.cat([torch.full((2,), pad), short_row])])
        mask = torch.ones_like(padded)
        mask[1, :2] = 0
        return [long_row.tolist(), short_row.tolist()], padded, mask

    def run_ref(seed):
        _, padded, mask = build(seed)
        return _dream_reference(model, padded, seed, alg, gen, steps, 1.0, {"top_p": 0.95},
                                attention_mask=mask)

    seed, ref = pick_seed(run_ref)
    assert_no_mask(model, ref, DREAM_PROMPT_LEN)
    rows, padded, _ = build(seed)
    out = dllm.generate(model, rows, sampler=alg, gen_length=gen, steps=steps, temperature=1.0,
                        seed=seed, top_p=0.95)
    assert out.sequences.shape == ref.shape
    # the generated region must agree; the prompt region may differ only in the pad id used
    assert torch.equal(out.sequences[:, DREAM_PROMPT_LEN:], ref[:, DREAM_PROMPT_LEN:]), (
        f"seed {seed}\nref  {ref.tolist()}\ndllm {out.sequences.tolist()}"
    )
    assert out.nfe == steps
