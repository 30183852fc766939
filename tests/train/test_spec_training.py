"""The AR target / DFlash drafter recipes: the loss targets, the block layout, and short runs
that save checkpoints loadable by transformers and by load_dflash."""

import json
from dataclasses import replace

import pytest

import torch

from dllm import tasks as T
from dllm.drafters.dflash.io import load_dflash
from dllm.tasks.vocab import EOS, word_id
from dllm.train.ar import LONG_MIXTURE, ARPhase, ar_recipes, answer_targets, build_ar_model, train_ar
from dllm.train.data import Batch, collate
from dllm.train.drafters.dflash_train import block_layout, dflash_recipes, sample_anchors, train_dflash

SMALL = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16)


def small_ar(**kw):
    base = ar_recipes.get("tiny-ar")
    return base.with_overrides(model=dict(base.model, **SMALL), **kw)


def test_answer_targets_stop_after_the_first_eos():
    ex = T.test_split("copy", 4, n=1)[0]
    vocab = {w: i for i, w in enumerate(T.vocabulary())}
    batch = collate([ex], vocab)
    labels, weight = answer_targets(batch)
    kept = labels[weight.bool()].tolist()
    assert kept == [vocab[w] for w in ex.answer] + [word_id(EOS)]  # the answer, then one EOS


def test_block_layout_sees_the_context_before_the_anchor_and_its_own_block():
    anchors = torch.tensor([[5, 9]])
    positions, mask = block_layout(anchors, context=12, block=4)
    assert positions.tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    m = mask[0, 0]  # [8, 12 + 8]
    assert m[0, :12].tolist() == [True] * 5 + [False] * 7  # block 0: context 0..4
    assert m[5, :12].tolist() == [True] * 9 + [False] * 3  # block 1: context 0..8
    assert m[:4, 12:16].all() and not m[:4, 16:].any() and m[4:, 16:].all() and not m[4:, 12:16].any()


def test_anchors_lie_in_the_answer_and_are_distinct():
    gen = torch.Generator().manual_seed(0)
    a = sample_anchors(torch.tensor([10, 20]), torch.tensor([40, 30]), 6, gen)
    assert a.shape == (2, 6)
    assert ((a[0] >= 10) & (a[0] <= 38)).all() and ((a[1] >= 20) & (a[1] <= 28)).all()
    assert len(set(a[0].tolist())) == 6 and (a.diff(dim=1) > 0).all()


def test_ar_run_saves_a_transformers_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dllm.train.schedule import lr_factor

    recipe = small_ar(steps=3, batch_size=4, eval_every=0, eval_per_size=1, log_every=1, phases=(), warmup=2)
    last = train_ar(recipe, tmp_path, progress=False)
    assert 0.0 <= last["eval"]["mean"] <= 1.0 and set(last["eval"]) >= set(T.suite_task_names("long-answer"))
    logged = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines() if '"loss"' in line]
    assert len(logged) == 3 and all(r["loss"] == r["loss"] for r in logged)
    # each line's lr is the rate its step used (not the next step's)
    assert [r["lr"] for r in logged] == pytest.approx(
        [recipe.lr * lr_factor(s, warmup=2, total=3, min_ratio=recipe.min_lr_ratio) for s in range(3)])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    tok = AutoTokenizer.from_pretrained(tmp_path / "final")
    assert model.config.eos_token_id == word_id(EOS) and tok.convert_tokens_to_ids("copy_long") == 80
    assert model.model.embed_tokens.weight.std() > 0.5  # the unit-scale embedding init


def test_dflash_run_saves_an_official_checkpoint_for_the_target(tmp_path):
    target = build_ar_model(small_ar()).eval()
    recipe = dflash_recipes.get("tiny-ar-dflash").with_overrides(
        steps=2, pool=4, batch_size=2, eval_examples=1, log_every=1, num_layers=1, block_size=4,
        target_layer_ids=(0, 1))
    result = train_dflash(recipe, tmp_path, target=target, progress=False)
    assert result["tau_teacher_forced"] >= 1.0 and result["blocks"] > 0
    drafter = load_dflash(tmp_path / "final", target=target)
    assert drafter.block_size == 4 and drafter.mask_token_id == 1
    assert json.loads((tmp_path / "final" / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]


def test_a_later_phase_continues_exactly_from_the_saved_phase(tmp_path):
    from safetensors.torch import load_file

    recipe = small_ar(steps=2, batch_size=2, eval_every=0, eval_per_size=1, log_every=1,
                      phases=(ARPhase(2, 5e-4, LONG_MIXTURE, warmup=1),))
    train_ar(recipe, tmp_path / "full", progress=False)
    assert (tmp_path / "full" / "phase-0").is_dir() and (tmp_path / "full" / "phase-1").is_dir()
    train_ar(recipe, tmp_path / "split", progress=False, start_phase=1, init_from=tmp_path / "full" / "phase-0")
    full = load_file(tmp_path / "full" / "final" / "model.safetensors")
    split = load_file(tmp_path / "split" / "final" / "model.safetensors")
    before = load_file(tmp_path / "full" / "phase-0" / "model.safetensors")
    assert all(torch.equal(full[k], split[k]) for k in full)  # the same run, resumed at the phase
    assert not all(torch.equal(full[k], before[k]) for k in full)  # and phase 1 trained


def test_a_start_phase_or_stop_that_trains_nothing_is_refused(tmp_path, capsys):
    from dllm.train.__main__ import main

    recipe = small_ar(steps=2, phases=(ARPhase(2, 5e-4, LONG_MIXTURE, warmup=1),))
    with pytest.raises(ValueError, match=r"start_phase must be an integer in \[0, 1\] \(recipe 'tiny-ar' has 2 "
                                         r"phases\), got 2"):
        train_ar(recipe, tmp_path / "past", progress=False, start_phase=2)
    with pytest.raises(ValueError, match=r"stop_at=2 ends before phase 1 .* trains steps 3..4: pass a stop_at > 2"):
        train_ar(recipe, tmp_path / "before", progress=False, start_phase=1, stop_at=2)
    assert not (tmp_path / "past").exists() and not (tmp_path / "before").exists()  # no final/ of the init
    with pytest.raises(ValueError, match="start_phase must be an integer in \\[0, 1\\]"):  # the dry run too
        main(["--recipe", "tiny-ar", "--start-phase", "5", "--dry-run"])


def test_mixed_block_sizes_cycle_with_the_same_positions_per_step():
    recipe = dflash_recipes.get("tiny-ar-dflash-mixed")
    assert recipe.block_sizes == (4, 8, 12, 16) and recipe.block_size == 16
    steps = [recipe.step_block(s) for s in range(5)]
    assert steps == [(4, 32), (8, 16), (12, 10), (16, 8), (4, 32)]
    assert dflash_recipes.get("tiny-ar-dflash").step_block(3) == (16, 8)  # one size: the recipe's


def test_mixed_block_sizes_must_fit_the_trained_block():
    with pytest.raises(ValueError, match=r"block_sizes \[4, 20\]: every size must be an int in \[2, block_size=16\], got \[20\]"):
        dflash_recipes.get("tiny-ar-dflash").with_overrides(block_sizes=(4, 20))


def test_a_mixed_run_reports_tau_per_block_size(tmp_path):
    target = build_ar_model(small_ar()).eval()
    recipe = dflash_recipes.get("tiny-ar-dflash-mixed").with_overrides(
        steps=2, pool=4, batch_size=2, eval_examples=1, log_every=1, num_layers=1, block_size=4,
        block_sizes=(2, 4), target_layer_ids=(0, 1))
    result = train_dflash(recipe, tmp_path, target=target, progress=False)
    assert {"tau_teacher_forced_block2", "tau_teacher_forced_block4"} <= set(result)
    assert result["tau_teacher_forced_block2"] <= 2.0  # one draft per block of 2
    assert result["tau_teacher_forced_block4"] == result["tau_teacher_forced"]  # the trained size


def test_filled_slots_are_inputs_not_labels():
    from dllm.drafters.dflash.io import random_dflash
    from dllm.train.drafters.dflash_train import block_loss

    target = build_ar_model(small_ar()).eval()
    drafter = random_dflash(target, 1, 4, 1, seed=0, target_layer_ids=(0, 1))
    ids = torch.randint(5, 60, (1, 20), generator=torch.Generator().manual_seed(0))
    anchors, lengths = torch.tensor([[6, 11]]), torch.tensor([20])
    seen = []
    hook = drafter.register_forward_hook(lambda m, args, out: seen.append(args[0].detach().clone()))
    try:
        plain, _ = block_loss(drafter, target, ids, lengths, anchors, 7.0)
        filled, hits = block_loss(drafter, target, ids, lengths, anchors, 7.0, fills=torch.tensor([[2, 0]]))
        everything, _ = block_loss(drafter, target, ids, lengths, anchors, 7.0, fills=torch.tensor([[3, 3]]))
    finally:
        hook.remove()
    emb = target.get_input_embeddings().weight
    # block 0 (anchor 6): slots 1 and 2 hold tokens 7 and 8; slot 3 and block 1 stay masks
    assert torch.equal(seen[1][0, 1], emb[ids[0, 7]]) and torch.equal(seen[1][0, 2], emb[ids[0, 8]])
    assert torch.equal(seen[1][0, 3], emb[1]) and torch.equal(seen[1][0, 5], seen[0][0, 5])
    assert not torch.equal(plain, filled) and hits[0, 0] >= 2  # the given slots count as accepted
    assert everything.item() == 0.0  # every slot given: nothing left to predict


def test_fill_options_are_checked():
    with pytest.raises(ValueError, match="fill_prob must be a number in \\[0, 1\\], got 1.5"):
        dflash_recipes.get("tiny-ar-dflash").with_overrides(fill_prob=1.5)
    with pytest.raises(ValueError, match="max_fill must be an integer >= 1 \\(filled slots after the anchor\\), got 0"):
        dflash_recipes.get("tiny-ar-dflash").with_overrides(max_fill=0)


def test_held_out_rows_with_a_one_token_answer_are_skipped_not_a_crash():
    from dllm.drafters.dflash.io import random_dflash
    from dllm.drafters.jetspec.io import random_jetspec
    from dllm.tasks.vocab import MASK
    from dllm.train.drafters import dflash_train, dspark_train, jetspec_train

    target = build_ar_model(small_ar()).eval()
    eos = word_id(EOS)
    rows, lens = [[5, 6, 7, eos], [5, 6, 8, 9, eos]], [3, 3]  # the first: the target said EOS at once
    dflash = random_dflash(target, 1, 4, word_id(MASK), seed=0, target_layer_ids=(0, 1)).eval()
    jetspec = random_jetspec(target, 1, 4, word_id(MASK), seed=0, target_layer_ids=(0, 1)).eval()
    recipe = replace(dspark_train.dspark_recipes.get("tiny-ar-dspark"), init=None, num_layers=1, block_size=3,
                     target_layer_ids=(0, 1))  # a random backbone (with_overrides ignores None)
    dspark = dspark_train.init_model(recipe, target).eval()
    for tau in (dflash_train.teacher_forced_tau(dflash, target, rows, lens),
                jetspec_train.teacher_forced_tau(jetspec, target, rows, lens),
                dspark_train.teacher_forced_tau(dspark, target, rows, lens, recipe)):
        assert tau["blocks"] == 1 and 1.0 <= tau["tau_teacher_forced"] <= 2.0  # the second row's one anchor
    assert dflash_train.teacher_forced_tau(dflash, target, rows[:1], lens[:1]) == {"tau_teacher_forced": 1.0,
                                                                                  "blocks": 0}


def test_held_out_rows_are_regenerated_to_their_own_answer_length(monkeypatch):
    """A pool drawn at copy_long size 32 (33-token answers) and the held-out test split at 32 / 48 / 64:
    each held-out row gets up to its own answer length (65 at 64), not the pool's longest (the old code
    cut the target's held-out answers at 33 tokens, so tau was measured on truncated rows)."""
    from types import SimpleNamespace

    from dllm.train.data import MixtureConfig
    from dllm.train.drafters import steps

    asked: list[int] = []

    def greedy(target, prompts, max_new_tokens):  # a target that never stops early
        asked.append(max_new_tokens)
        return [[word_id("A")] * max_new_tokens for _ in prompts]

    monkeypatch.setattr(steps, "greedy_answers", greedy)
    recipe = SimpleNamespace(mixture=MixtureConfig(tasks=("copy_long",), sizes=((32,),)), seed=0, pool=2,
                             eval_examples=1)
    data = steps.draft_data(None, recipe)
    assert asked == [33, 65]
    assert max(len(r) - len(p) for r, p in zip(data.held_rows, data.held_prompts)) == 65


def test_the_drafter_log_gives_the_rate_each_logged_step_used():
    """Warm-up 4 to lr 1.0: step 1 runs at 0.25, step 2 at 0.5 (the old log gave the next step's rate)."""
    import io
    from types import SimpleNamespace

    from dllm.train.drafters.steps import DraftData, train_steps

    w = torch.nn.Parameter(torch.zeros(()))
    recipe = SimpleNamespace(name="t", steps=10, lr=1.0, warmup=4, min_lr_ratio=0.1, seed=0, batch_size=1, clip=1.0,
                             log_every=1)
    data = DraftData([[1]], [[1, 2]], [], [])
    log = io.StringIO()
    train_steps(recipe, [w], lambda step, ids, lens, plens, gen: ((w - 1) ** 2, torch.ones(1, dtype=torch.bool)),
                data, log, 0.0, weight_decay=0.0, progress=False, stop_at=2)
    assert [json.loads(line)["lr"] for line in log.getvalue().splitlines()] == [0.25, 0.5]
