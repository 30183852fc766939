"""Per-request block size: the block head (``dllm.drafters.block_head``), ``block_size="auto"`` in the
loop, and the label walk of its trainer (``dllm.train.block_head_train``)."""

import pytest
import torch

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.drafters.block_head import BlockHead, has_block_head, load_block_head, prompt_features
from dllm.drafters.loading import load_target
from dllm.drafters.loop import speculative_generate
from dllm.train.block_head_train import accepted_prefixes, fit_line, rounds_of, train_head


class FixedHead(BlockHead):
    """A head whose picks are given (one per row, in call order): the loop's side alone."""

    def __init__(self, sizes, features, picks):
        super().__init__(sizes, features)
        self.picks = list(picks)

    def choose(self, feats):
        assert feats.shape == (len(self.picks), self.features)
        return list(self.picks)


@pytest.fixture(scope="module")
def pair():
    target, tok = load_target("tiny-ar")
    return target, tok, make_drafter("dflash", model="tiny-ar-dflash")


def long_prompts(tok, per_size=1):
    vocab = tok.get_vocab()
    return [[vocab[w] for w in T.prompt_words(ex)] for n in T.suite_task_names("long-answer")
            for ex in T.test_split(n, None, n=per_size)]


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
    with pytest.raises(ValueError, match="distinct positive ints"):
        BlockHead((8, 8), features=4)
    with pytest.raises(FileNotFoundError, match="block_head.json is missing"):
        load_block_head(tmp_path / "nowhere")


def test_training_minimises_the_expected_time():
    """Two kinds of prompt, each fastest at another size: the trained head picks each one's size."""
    from dllm.train.block_head_train import HeadRecipe

    torch.manual_seed(0)
    feats = torch.cat([torch.randn(32, 6) + 3, torch.randn(32, 6) - 3])
    times = torch.cat([torch.tensor([[1.0, 2.0]]).expand(32, 2), torch.tensor([[3.0, 1.0]]).expand(32, 2)])
    head = train_head(feats, times, HeadRecipe(sizes=(8, 32), hidden=16, epochs=200))
    assert head.choose(feats) == [8] * 32 + [32] * 32


def test_fit_line():
    a, b = fit_line([8, 16, 32], [2.0, 3.0, 5.0])
    assert a == pytest.approx(1.0) and b == pytest.approx(0.125)


@pytest.mark.slow
def test_the_walk_counts_the_rounds_of_a_real_greedy_call(pair):
    """The trainer's labels: rounds_of(teacher-forced prefixes) = the loop's rounds, batch 1."""
    target, tok, drafter = pair
    for prompt in long_prompts(tok)[::2]:
        row = list(prompt) + reference(target, prompt)
        for block in (4, 9, 16):
            acc = accepted_prefixes(drafter.model, target, row, len(prompt), block)
            out = speculative_generate(target, drafter, [prompt], max_new_tokens=66, block_size=block)
            assert rounds_of(acc, block) == out.rounds, (block, prompt[:3])


@pytest.mark.slow
def test_auto_block_sizes_per_row_are_lossless(pair):
    """Rows of one call at different block sizes: each row verifies its own drafts, greedy output is
    target.generate's, batch 1 forwards exactly its size."""
    target, tok, drafter = pair
    ids = long_prompts(tok)
    feats = 2 * drafter.model.config.hidden_size * len(drafter.target_layers)
    picks = [4, 16, 8, 16, 4, 12, 16, 8, 4][:len(ids)]
    out = speculative_generate(target, drafter, ids, max_new_tokens=66, block_size=FixedHead((4, 8, 12, 16), feats,
                                                                                             picks))
    assert out.row_block_sizes == picks and out.block_size == 16
    for row, prompt in enumerate(ids):
        assert out.generated[row] == reference(target, prompt)
        assert max(out.acceptance[row]) <= picks[row]  # a row commits at most its own block
    sampled = speculative_generate(target, drafter, ids, max_new_tokens=66, temperature=1.0, seed=0,
                                   block_size=FixedHead((4, 8, 12, 16), feats, picks))
    assert all(max(sampled.acceptance[row]) <= picks[row] for row in range(len(ids)))  # T > 0: the same cap
    one = speculative_generate(target, drafter, [ids[0]], max_new_tokens=66, block_size=FixedHead((4, 16), feats, [4]))
    fixed = speculative_generate(target, drafter, [ids[0]], max_new_tokens=66, block_size=4)
    assert one.acceptance == fixed.acceptance and one.generated == fixed.generated


def test_auto_needs_a_head_that_can_read_the_prefill(pair):
    target, tok, drafter = pair
    prompt = long_prompts(tok)[0]
    with pytest.raises(ValueError, match="the 'dflash' drafter has none"):
        speculative_generate(target, drafter, [prompt], max_new_tokens=4, block_size="auto")
    with pytest.raises(ValueError, match="taps no target layers"):
        speculative_generate(target, "ngram", [prompt], max_new_tokens=4, block_size=FixedHead((4,), 8, [4]))
    with pytest.raises(ValueError, match="does not combine with a draft tree"):
        speculative_generate(target, drafter, [prompt], max_new_tokens=4, block_size=FixedHead((4,), 512, [4]),
                             tree="ddtree:budget=8")
    with pytest.raises(ValueError, match="positive int, 'auto' or a BlockHead, got 'big'"):
        speculative_generate(target, drafter, [prompt], max_new_tokens=4, block_size="big")
    with pytest.raises(ValueError, match="exceeds the dflash drafter's trained block size"):
        speculative_generate(target, drafter, [prompt], max_new_tokens=4, block_size=FixedHead((4, 32), 512, [4]))


@pytest.mark.slow
def test_the_shipped_wide_drafter_and_its_head(pair, capsys):
    """tiny-ar-dflash-wide ships a head: "auto" is lossless, picks from its sizes, and gives the copy
    tasks (long accepted runs) longer blocks than reverse_long (short ones), as it was trained to."""
    import json

    from dllm.cli import main

    target, tok, _ = pair
    wide = make_drafter("dflash", model="tiny-ar-dflash-wide")
    assert wide.block_size == 32 and wide.block_head.sizes == (8, 12, 16, 20, 24, 32)
    vocab = tok.get_vocab()
    picks = {}
    for name in ("copy_long", "reverse_long"):
        exs = T.test_split(name, None, n=4)
        ids = [[vocab[w] for w in T.prompt_words(ex)] for ex in exs]
        out = speculative_generate(target, wide, ids, max_new_tokens=66, block_size="auto")
        assert all(out.generated[r] == reference(target, p) for r, p in enumerate(ids))
        picks[name] = out.row_block_sizes
        assert set(picks[name]) <= set(wide.block_head.sizes)
    assert sum(picks["copy_long"]) > sum(picks["reverse_long"]), picks
    prompt = " ".join(T.prompt_words(T.test_split("copy_long", None, n=1)[0]))
    assert main(["spec", "--target", "tiny-ar", "--drafter", "dflash:model=tiny-ar-dflash-wide", "--block-size", "auto",
                 "--prompt", prompt, "--max-new-tokens", "66", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["row_block_sizes"][0] in wide.block_head.sizes and got["generated"][0] == reference(
        target, [vocab[w] for w in prompt.split()])


@pytest.mark.slow
def test_the_trainer_end_to_end_on_a_few_prompts(tmp_path, capsys):
    """python -m dllm.train.block_head_train on 8 prompts: round times, walks, a head that loads."""
    from dllm.train.block_head_train import main

    assert main(["--drafter", "tiny-ar-dflash-wide", "--prompts", "8", "--eval-n", "1", "--out", str(tmp_path)]) == 0
    head = load_block_head(tmp_path)
    sims = head.meta["simulated"]["eval"]
    assert head.sizes == (8, 12, 16, 20, 24, 32) and head.meta["drafter"] == "tiny-ar-dflash-wide"
    assert sims["best_per_prompt"] <= min(sims[k] for k in sims if k != "best_per_prompt") > 0
    assert sorted(int(b) for b in head.meta["round_ms"]) == [8, 12, 16, 20, 24, 32]
    assert "eval picks per task" in capsys.readouterr().out
