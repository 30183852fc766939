"""Per-request block size: the block head (``dllm.drafters.dflash.block_head``), ``plan="auto"`` in the
loop, and the label walk of its trainer (``dllm.train.drafters.block_head_train``)."""

import pytest
import torch

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.drafters.dflash.block_head import BlockHead, has_block_head, load_block_head, prompt_features
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.train.drafters.block_head_train import accepted_prefixes, fit_line, rounds_of, train_head
from tests.drafters.speculative_helpers import long_answer_prompts


class FixedHead(BlockHead):
    """A head whose picks are given (a block size per row, in call order; or plan indices with
    ``trees``): the loop's side alone."""

    def __init__(self, sizes, features, picks, trees=None):
        super().__init__(sizes, features, trees=trees)
        self.idx = list(picks) if trees is not None else [self.sizes.index(p) for p in picks]

    def pick(self, feats):
        assert feats.shape == (len(self.idx), self.features)
        return list(self.idx)


def reference(target, prompt):
    return target.generate(torch.tensor([prompt]), max_new_tokens=66, do_sample=False)[0, len(prompt):].tolist()


def test_rounds_of_walks_the_accepted_prefixes():
    # offsets 0..5; answer's last token at offset 6
    acc = [3, 0, 0, 0, 5, 5]
    assert rounds_of(acc, 8) == 2  # offset 0 -> 4 (3 drafts + 1) -> 10 (5 drafts + 1)
    assert rounds_of(acc, 3) == 3  # at most 2 drafts: 0 -> 3 -> 4 -> 7
    assert rounds_of(acc, 2) == 4  # one draft at most: 0 -> 2 -> 3 -> 4 -> 6
    assert rounds_of(acc, 1) == 6  # no drafts: one token per round
    assert rounds_of([], 16) == 0  # the prefill's token was the whole answer


def test_prompt_features_pool_the_valid_positions_and_the_last_one():
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)  # [R=2, Lp=3, F=2]
    valid = torch.tensor([[False, True, True], [True, True, True]])  # row 0 left-padded by one
    feats = prompt_features(hidden, valid)
    assert torch.equal(feats[0], torch.tensor([3.0, 4.0, 4.0, 5.0]))  # mean of positions 1-2, then position 2
    assert torch.equal(feats[1], torch.tensor([8.0, 9.0, 10.0, 11.0]))


def test_head_saves_loads_and_chooses(tmp_path):
    head = BlockHead((8, 16), features=4, hidden=8, meta={"drafter": "x"})
    feats = torch.randn(5, 4)
    assert not has_block_head(tmp_path)
    head.save(tmp_path)
    again = load_block_head(tmp_path)
    assert again.sizes == (8, 16) and again.meta["drafter"] == "x"
    assert again.choose(feats) == head.choose(feats) and set(head.choose(feats)) <= {8, 16}
    with pytest.raises(ValueError, match=r"\[rows, 4\] pooled features"):
        head.choose(torch.randn(5, 3))
    with pytest.raises(ValueError, match="plans must be distinct"):
        BlockHead((8, 8), features=4)
    assert BlockHead((8, 8), features=4, trees=(None, "ddtree:budget=8")).tree_specs == ["ddtree:budget=8"]
    with pytest.raises(FileNotFoundError, match="block_head.json is missing"):
        load_block_head(tmp_path / "nowhere")


def test_training_minimises_the_expected_time():
    """Two kinds of prompt, each fastest at another size: the trained head picks each one's size."""
    from dllm.train.drafters.block_head_train import HeadRecipe

    torch.manual_seed(0)
    feats = torch.cat([torch.randn(32, 6) + 3, torch.randn(32, 6) - 3])
    times = torch.cat([torch.tensor([[1.0, 2.0]]).expand(32, 2), torch.tensor([[3.0, 1.0]]).expand(32, 2)])
    head = train_head(feats, times, HeadRecipe(sizes=(8, 32), hidden=16, epochs=200))
    assert head.choose(feats) == [8] * 32 + [32] * 32


def test_fit_line():
    a, b = fit_line([8, 16, 32], [2.0, 3.0, 5.0])
    assert a == pytest.approx(1.0) and b == pytest.approx(0.125)


@pytest.mark.slow
def test_the_walk_counts_the_rounds_of_a_real_greedy_call(tiny_pair):
    """The trainer's labels: rounds_of(teacher-forced prefixes) = the loop's rounds, batch 1, for
    answers that end (EOS) at least a block before max_new_tokens (near the cap the loop shortens
    its last block, as the dflash package does, which the walk does not model)."""
    target, tok, drafter = tiny_pair
    cap, checked = 66 + 16, 0
    for prompt in long_answer_prompts(tok)[1][::2]:
        answer = target.generate(torch.tensor([prompt]), max_new_tokens=cap, do_sample=False)[0, len(prompt):].tolist()
        if len(answer) > cap - 16 or answer[-1] != target.config.eos_token_id:
            continue
        row = list(prompt) + answer
        for block in (4, 9, 16):
            acc = accepted_prefixes(drafter.model, target, row, len(prompt), block)
            out = speculative_generate(target, drafter, [prompt], max_new_tokens=cap, plan=block)
            assert out.stop_reasons == ["eos"] and rounds_of(acc, block) == out.rounds, (block, prompt[:3])
            checked += 1
    assert checked >= 6


@pytest.mark.slow
def test_auto_block_sizes_per_row_are_lossless(tiny_pair):
    """Rows of one call at different block sizes: each row verifies its own drafts, greedy output is
    target.generate's, batch 1 forwards exactly its size."""
    target, tok, drafter = tiny_pair
    ids = long_answer_prompts(tok)[1]
    feats = 2 * drafter.model.config.hidden_size * len(drafter.target_layers)
    picks = [4, 16, 8, 16, 4, 12, 16, 8, 4][:len(ids)]
    out = speculative_generate(target, drafter, ids, max_new_tokens=66, plan=FixedHead((4, 8, 12, 16), feats, picks))
    assert out.row_block_sizes == picks and out.block_size == 16
    for row, prompt in enumerate(ids):
        assert out.generated[row] == reference(target, prompt)
        assert max(out.acceptance[row]) <= picks[row]  # a row commits at most its own block
    sampled = speculative_generate(target, drafter, ids, max_new_tokens=66, temperature=1.0, seed=0,
                                   plan=FixedHead((4, 8, 12, 16), feats, picks))
    assert all(max(sampled.acceptance[row]) <= picks[row] for row in range(len(ids)))  # T > 0: the same cap
    one = speculative_generate(target, drafter, [ids[0]], max_new_tokens=66, plan=FixedHead((4, 16), feats, [4]))
    fixed = speculative_generate(target, drafter, [ids[0]], max_new_tokens=66, plan=4)
    assert one.acceptance == fixed.acceptance and one.generated == fixed.generated


def test_auto_needs_a_head_that_can_read_the_prefill(tiny_pair):
    target, tok, drafter = tiny_pair
    prompt = long_answer_prompts(tok)[1][0]
    with pytest.raises(ValueError, match="the 'dflash' drafter has none"):
        speculative_generate(target, drafter, [prompt], max_new_tokens=4, plan="auto")
    with pytest.raises(ValueError, match="taps no target layers"):
        speculative_generate(target, "ngram", [prompt], max_new_tokens=4, plan=FixedHead((4,), 8, [4]))
    with pytest.raises(ValueError, match="a Plan with a block head picks each row's block size and tree itself"):
        Plan(head=FixedHead((4,), 512, [4]), tree="ddtree:budget=8")
    with pytest.raises(ValueError, match="plan must be a Plan, 'auto', a BlockHead or a positive int block size, "
                                         "got 'big'"):
        speculative_generate(target, drafter, [prompt], max_new_tokens=4, plan="big")
    with pytest.raises(ValueError, match="exceeds the dflash drafter's trained block size"):
        speculative_generate(target, drafter, [prompt], max_new_tokens=4, plan=FixedHead((4, 32), 512, [4]))


@pytest.mark.slow
def test_the_shipped_wide_drafter_and_its_head(tiny_pair, capsys):
    """tiny-ar-dflash-wide ships a head over chain and tree plans: "auto" is lossless, picks from its
    plans, gives the copy tasks (long accepted runs) long chains and reverse_long (short runs) shorter
    blocks or trees, as it was trained to."""
    import json

    from dllm.cli import main

    target, tok, _ = tiny_pair
    wide = make_drafter("dflash", model="tiny-ar-dflash-wide")
    assert wide.block_size == 32 and wide.block_head.sizes[:6] == (8, 12, 16, 20, 24, 32)
    assert wide.block_head.tree_specs == ["ddtree:budget=16", "ddtree:budget=32"]
    vocab = tok.get_vocab()
    picks = {}
    for name in ("copy_long", "reverse_long"):
        exs = T.test_split(name, None, n=4)
        ids = [[vocab[w] for w in T.prompt_words(ex)] for ex in exs]
        out = speculative_generate(target, wide, ids, max_new_tokens=66, plan="auto")
        assert all(out.generated[r] == reference(target, p) for r, p in enumerate(ids))
        assert len(set(out.row_trees)) == 1  # what ran: one tree setting for the call's rows
        if out.row_trees[0] is not None:
            assert len(set(out.row_block_sizes)) == 1  # ... and, with a tree, one depth
        # each row alone runs its own pick (batch 1: what ran is what the head picked)
        alone = [speculative_generate(target, wide, [p], max_new_tokens=4, plan="auto") for p in ids]
        picks[name] = [(a.row_block_sizes[0], a.row_trees[0]) for a in alone]
        assert set(picks[name]) <= set(zip(wide.block_head.sizes, wide.block_head.trees))
    assert all(b >= 20 and t is None for b, t in picks["copy_long"]), picks
    assert all(b <= 20 or t is not None for b, t in picks["reverse_long"]), picks
    prompt = " ".join(T.prompt_words(T.test_split("copy_long", None, n=1)[0]))
    assert main(["spec", "--target", "tiny-ar", "--drafter", "dflash:model=tiny-ar-dflash-wide", "--block-size", "auto",
                 "--prompt", prompt, "--max-new-tokens", "66", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["row_block_sizes"][0] in wide.block_head.sizes and got["generated"][0] == reference(
        target, [vocab[w] for w in prompt.split()])


@pytest.mark.slow
def test_the_trainer_end_to_end_on_a_few_prompts(tmp_path, capsys):
    """python -m dllm.train.drafters.block_head_train on 8 prompts: round times, walks, a head that loads."""
    from dllm.train.drafters.block_head_train import main

    assert main(["--drafter", "tiny-ar-dflash-wide", "--prompts", "8", "--eval-n", "1", "--out", str(tmp_path)]) == 0
    head = load_block_head(tmp_path)
    sims = head.meta["simulated"]["eval"]
    assert head.sizes == (8, 12, 16, 20, 24, 32) and head.meta["drafter"] == "tiny-ar-dflash-wide"
    assert sims["best_per_prompt"] <= min(sims[k] for k in sims if k != "best_per_prompt") > 0
    assert sorted(int(b) for b in head.meta["round_ms"]) == [8, 12, 16, 20, 24, 32]
    assert "eval picks per task" in capsys.readouterr().out


def test_shared_tree_is_the_most_picked_with_ties_to_the_first_plan():
    from dllm.drafters.plan import shared_tree

    trees = (None, "ddtree:budget=16", None, "ddtree:budget=32")
    assert shared_tree([1, 1, 0], trees) == "ddtree:budget=16"
    assert shared_tree([0, 2, 3, 1], trees) is None  # chain picked twice (plans 0 and 2)
    assert shared_tree([3, 1], trees) == "ddtree:budget=16"  # a tie: plan 1 is listed before plan 3


@pytest.mark.slow
def test_tree_plans_are_lossless_and_match_the_tree_call(tiny_pair):
    """A head plan with a tree runs exactly as plan=Plan(block_size, tree); a batch shares the most picked."""
    target, tok, drafter = tiny_pair
    ids = long_answer_prompts(tok)[1][:3]
    feats = 2 * drafter.model.config.hidden_size * len(drafter.target_layers)
    trees = (None, "ddtree:budget=16")
    one = speculative_generate(target, drafter, [ids[0]], max_new_tokens=66,
                               plan=FixedHead((16, 16), feats, [1], trees=trees))
    ref = speculative_generate(target, drafter, [ids[0]], max_new_tokens=66,
                               plan=Plan(block_size=16, tree="ddtree:budget=16"))
    assert one.acceptance == ref.acceptance and one.generated == ref.generated and one.row_trees == [trees[1]]
    batch = speculative_generate(target, drafter, ids, max_new_tokens=66,
                                 plan=FixedHead((16, 16), feats, [1, 0, 1], trees=trees))
    assert batch.row_trees == [trees[1]] * 3  # what ran: the most picked tree, for every row
    assert all(batch.generated[r] == reference(target, p) for r, p in enumerate(ids))
