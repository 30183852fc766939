"""Train a block head (``dllm.drafters.block_head``): which block size is fastest for this prompt?

    python -m dllm.train.block_head_train --drafter tiny-ar-dflash-wide --out runs/block-head

BlockPilot (arXiv 2606.31315) trains an MLP on the prefill representation to pick the block size of
a DFlash drafter per request. Our labels need no decoding runs per candidate:

1. Greedy rounds are a walk (``rounds_of``). At T = 0 every committed token is the target's greedy
   answer, so the drafter's context at an anchor is the teacher-forced one, and a round at anchor
   ``a`` with block B commits ``min(acc_B(a), B - 1) + 1`` tokens, where ``acc_B(a)`` is the
   drafter's accepted prefix at ``a`` (``dflash_train.block_loss``, every anchor of a row in one
   forward). The walk starts at the prefill's token and ends at the answer's last token.
2. Round time per block size (``round_times``): ``speculative_generate`` on a few prompts at each
   size, interleaved passes, then a least-squares line ``t(B) = a + b * B`` over the sizes (the
   drafter's and the target's forward both grow with B); time(prompt, B) = rounds * t(B).
3. The head (pooled tapped prefill states -> a score per size) minimises the expected relative time
   under its softmax, ``sum_B softmax(z)_B * time_B / min_B time_B`` (cost-sensitive: a near-tie
   costs little, a bad pick much).

Training prompts come from the long-answer mixture (test split held out); the evaluation prints,
on test instances ``--eval-from``.., the simulated time of the head's picks against every fixed size
and against the per-prompt best (the bound of any rule). The head is saved as ``block_head.*``
(``--out``), ready to sit beside the drafter's checkpoint.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import torch

from dllm import tasks as T
from dllm.drafters.block_head import BlockHead, prompt_features
from dllm.drafters.dflash_model import extract_context_feature
from dllm.train.ar import LONG_MIXTURE, hf_tokenizer
from dllm.train.data import TaskMixture
from dllm.train.dflash_train import block_loss, regenerate


@dataclass(frozen=True)
class HeadRecipe:
    drafter: str = "tiny-ar-dflash-wide"
    target: str = "tiny-ar"
    sizes: tuple[int, ...] = (8, 12, 16, 20, 24, 32)
    prompts: int = 1024  # training prompts from the long-answer mixture
    hidden: int = 64
    epochs: int = 300  # full-batch steps
    lr: float = 3e-3
    weight_decay: float = 1e-2
    timing_prompts: int = 6  # prompts timed per size for t(B)
    seed: int = 0


def accepted_prefixes(drafter, target, row: Sequence[int], prompt_len: int, block: int) -> list[int]:
    """acc_B(a) for every anchor a = prompt_len .. len(row) - 2 of one regenerated row (teacher-forced,
    greedy), index a - prompt_len."""
    ids = torch.tensor([list(row)])
    anchors = torch.arange(prompt_len, len(row) - 1)[None]  # [1, A]
    if anchors.numel() == 0:
        return []
    with torch.no_grad():
        _, acc = block_loss(drafter, target, ids, torch.tensor([len(row)]), anchors, 7.0, block)
    return acc[0].tolist()


def rounds_of(accepted: Sequence[int], block: int) -> int:
    """Verification rounds of a greedy call whose first answer token came from the prefill: anchor
    offset c = 0 (that token) commits ``min(accepted[c], block - 1) + 1`` tokens per round until the
    answer's last token (offset ``len(accepted)``) is committed."""
    c, rounds, last = 0, 0, len(accepted)
    while c < last:
        c += min(accepted[c], block - 1) + 1
        rounds += 1
    return rounds


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (a, b) of y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def round_times(target, drafter_name: str, sizes: Sequence[int], prompts: Sequence[Sequence[int]],
                passes: int = 3) -> dict[int, float]:
    """Seconds per verification round at each block size (batch 1, greedy), from the fitted line."""
    from dllm.drafters.base import make_drafter
    from dllm.drafters.loop import speculative_generate

    drafter = make_drafter("dflash", model=drafter_name)
    wall = {b: 0.0 for b in sizes}
    rounds = {b: 0 for b in sizes}
    for rep in range(passes):  # the first pass warms up
        for p in prompts:
            for b in sizes:
                out = speculative_generate(target, drafter, [list(p)], max_new_tokens=66, block_size=b)
                if rep:
                    wall[b] += out.wall_time
                    rounds[b] += out.rounds
    per = [wall[b] / max(rounds[b], 1) for b in sizes]
    a, slope = fit_line(list(sizes), per)
    return {b: a + slope * b for b in sizes}


def time_table(drafter, target, rows, prompt_lens, sizes, t_round: dict[int, float]) -> torch.Tensor:
    """[N, S] simulated decode time (rounds x seconds per round) per prompt and size."""
    out = torch.zeros(len(rows), len(sizes))
    for i, (row, lp) in enumerate(zip(rows, prompt_lens)):
        for s, b in enumerate(sizes):
            out[i, s] = rounds_of(accepted_prefixes(drafter, target, row, lp, b), b) * t_round[b]
    return out


def features_of(target, taps: Sequence[int], prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """[N, 2F] pooled tapped prefill states, one prompt at a time (what the loop's prefill gives)."""
    feats = []
    with torch.no_grad():
        for p in prompts:
            out = target(input_ids=torch.tensor([list(p)]), output_hidden_states=True)
            hidden = extract_context_feature(out.hidden_states, taps)  # [1, Lp, F]
            feats.append(prompt_features(hidden, torch.ones(hidden.shape[:2], dtype=torch.bool)))
    return torch.cat(feats)


def train_head(feats: torch.Tensor, times: torch.Tensor, recipe: HeadRecipe) -> BlockHead:
    torch.manual_seed(recipe.seed)
    head = BlockHead(recipe.sizes, feats.shape[1], recipe.hidden)
    head.standardise(feats)
    rel = times / times.min(dim=1, keepdim=True).values  # [N, S] >= 1
    opt = torch.optim.AdamW(head.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    for _ in range(recipe.epochs):
        loss = (torch.softmax(head(feats), dim=1) * rel).sum(dim=1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return head.eval()


def evaluate(head: BlockHead, feats: torch.Tensor, times: torch.Tensor) -> dict[str, float]:
    """Total simulated time of the head's picks, of each fixed size and of the per-prompt best."""
    with torch.no_grad():
        pick = head(feats).argmax(dim=1)  # [N]
    res = {f"fixed_{b}": float(times[:, s].sum()) for s, b in enumerate(head.sizes)}
    res["head"] = float(times.gather(1, pick[:, None]).sum())
    res["best_per_prompt"] = float(times.min(dim=1).values.sum())
    return res


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dllm.drafters.dflash_io import load_dflash
    from dllm.drafters.loading import load_target

    ap = argparse.ArgumentParser(prog="python -m dllm.train.block_head_train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default=HeadRecipe.drafter)
    ap.add_argument("--prompts", type=int, default=HeadRecipe.prompts)
    ap.add_argument("--eval-from", type=int, default=8, help="first test instance per size of the evaluation")
    ap.add_argument("--eval-n", type=int, default=8, help="test instances per size of the evaluation")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/block-head")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = HeadRecipe(drafter=args.drafter, prompts=args.prompts)
    t0 = time.perf_counter()
    target, _ = load_target(recipe.target)
    target = target.float().eval()
    drafter = load_dflash(recipe.drafter).eval()
    if max(recipe.sizes) > drafter.block_size:
        raise ValueError(f"sizes {list(recipe.sizes)} exceed the drafter's trained block size {drafter.block_size}")
    vocab = hf_tokenizer().get_vocab()
    mix = TaskMixture(LONG_MIXTURE, seed=recipe.seed + 1, tokenizer=hf_tokenizer())
    rng = mix.rng(-1)
    train_prompts = [[vocab[w] for w in T.prompt_words(mix.sample(rng))] for _ in range(recipe.prompts)]
    held = [ex for n in T.suite_task_names("long-answer") for s in T.get_task(n).default_sizes
            for ex in T.test_split(n, s, n=args.eval_from + args.eval_n)[args.eval_from:]]
    held_prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in held]
    t_round = round_times(target, recipe.drafter, recipe.sizes, train_prompts[:recipe.timing_prompts])
    print("seconds per round:", {b: round(v * 1e3, 3) for b, v in t_round.items()}, "ms", flush=True)
    taps = list(drafter.target_layer_ids)
    tables = {}
    for name, prompts in (("train", train_prompts), ("eval", held_prompts)):
        rows = regenerate(target, prompts, 66)
        tables[name] = (features_of(target, taps, prompts),
                        time_table(drafter, target, rows, [len(p) for p in prompts], recipe.sizes, t_round))
    head = train_head(*tables["train"], recipe)
    report = {split: evaluate(head, *tables[split]) for split in tables}
    for split, res in report.items():
        base = min(v for k, v in res.items() if k.startswith("fixed_"))
        cells = ", ".join(f"{k} {base / v:.3f}x" for k, v in res.items())
        print(f"{split}: {cells} (speed vs the best fixed size)")
    with torch.no_grad():
        picks = head(tables["eval"][0]).argmax(dim=1).tolist()
    by_task: dict[str, list[int]] = {}
    for ex, p in zip(held, picks):
        by_task.setdefault(ex.task, []).append(recipe.sizes[p])
    print("eval picks per task:", {k: sorted(set(v)) for k, v in by_task.items()})
    head.meta = {"drafter": recipe.drafter, "recipe": asdict(recipe), "round_ms": {str(b): v * 1e3 for b, v in
                                                                                   t_round.items()},
                 "simulated": report, "seconds": round(time.perf_counter() - t0, 1)}
    out = head.save(args.out)
    print(f"wrote {out} ({json.dumps(report['eval'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
