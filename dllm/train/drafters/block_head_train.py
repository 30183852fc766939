"""Train a block head (``dllm.drafters.dflash.block_head``): which plan is fastest for this prompt?

    dllm train block-head --drafter tiny-ar-dflash-wide --out runs/block-head \
        --trees 16/ddtree:budget=16 32/ddtree:budget=16 32/ddtree:budget=32

BlockPilot (arXiv 2606.31315) trains an MLP on the prefill representation to pick the block size of
a DFlash drafter per request; ours picks among plans: the drafted chain at each block size of the
recipe and, with ``--trees``, draft trees (a block size and a tree builder). The chain plans' labels
need no decoding runs; a tree plan's rounds come from one real greedy call per prompt:

1. Greedy rounds are a walk (``rounds_of``). At T = 0 every committed token is the target's greedy
   answer, so the drafter's context at an anchor is the teacher-forced one, and a round at anchor
   ``a`` with block B commits ``min(acc_B(a), B - 1) + 1`` tokens, where ``acc_B(a)`` is the
   drafter's accepted prefix at ``a`` (``dflash_train.block_loss``, every anchor of a row in one
   forward). The walk starts at the prefill's token and ends at the answer's last token.
2. Round time per plan (``round_times``): ``speculative_generate`` on a few prompts under each
   plan, interleaved passes; for the chains a least-squares line ``t(B) = a + b * B`` over the sizes
   (the drafter's and the target's forward both grow with B), for a tree its own mean;
   time(prompt, plan) = rounds * t(plan).
3. The head (pooled tapped prefill states -> a score per plan) minimises the expected relative time
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
from dllm.drafters.dflash.block_head import BlockHead, prompt_features
from dllm.drafters.dflash.model import extract_context_feature
from dllm.scoring.exact_match import eval_examples
from dllm.train.ar import LONG_MIXTURE, hf_tokenizer
from dllm.train.data import TaskMixture
from dllm.flags import at_least
from dllm.train.drafters.dflash_train import ANSWER_TOKENS, block_loss, regenerate


@dataclass(frozen=True)
class HeadRecipe:
    drafter: str = "tiny-ar-dflash-wide"
    target: str = "tiny-ar"
    sizes: tuple[int, ...] = (8, 12, 16, 20, 24, 32)  # chain plans: the drafted chain at these block sizes
    tree_plans: tuple[tuple[int, str], ...] = ()  # (block size, tree builder spec) plans, e.g. (32, "ddtree:budget=32")
    prompts: int = 1024  # training prompts from the long-answer mixture
    hidden: int = 64
    epochs: int = 300  # full-batch steps
    lr: float = 3e-3
    weight_decay: float = 1e-2
    timing_prompts: int = 6  # prompts timed per plan for its round time
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


Plan = tuple[int, Optional[str]]  # (block size, tree builder spec or None for the drafted chain)


def plan_label(plan: Plan) -> str:
    return str(plan[0]) if plan[1] is None else f"{plan[0]}/{plan[1]}"


def greedy_rounds(target, drafter, prompt: Sequence[int], plan: Plan) -> tuple[int, float]:
    """(verification rounds, seconds) of one real greedy call at batch 1."""
    from dllm.drafters.loop import speculative_generate
    from dllm.drafters.plan import Plan as SpeculativePlan

    out = speculative_generate(target, drafter, [list(prompt)], max_new_tokens=ANSWER_TOKENS,
                               plan=SpeculativePlan(block_size=plan[0], tree=plan[1]))
    return out.rounds, out.wall_time


def round_times(target, drafter, plans: Sequence[Plan], prompts: Sequence[Sequence[int]],
                passes: int = 3) -> dict[Plan, float]:
    """Seconds per verification round of each plan (batch 1, greedy): the chain plans from a line fitted
    over their block sizes, each tree plan its own mean (a tree round's cost is its budget's)."""
    wall = {p: 0.0 for p in plans}
    rounds = {p: 0 for p in plans}
    for rep in range(passes):  # the first pass warms up
        for prompt in prompts:
            for plan in plans:
                n, sec = greedy_rounds(target, drafter, prompt, plan)
                if rep:
                    wall[plan] += sec
                    rounds[plan] += n
    per = {p: wall[p] / max(rounds[p], 1) for p in plans}
    chains = [p for p in plans if p[1] is None]
    a, slope = fit_line([p[0] for p in chains], [per[p] for p in chains]) if len(chains) > 1 else (0.0, 0.0)
    return {p: (a + slope * p[0] if p[1] is None and len(chains) > 1 else per[p]) for p in plans}


def time_table(drafter, target, rows, prompt_lens, plans: Sequence[Plan], t_round: dict[Plan, float],
               wrapper=None) -> torch.Tensor:
    """[N, S] decode time (rounds x seconds per round) per prompt and plan: a chain's rounds from the walk
    over teacher-forced accepted prefixes, a tree's from a real greedy call (``wrapper``: the drafter
    as ``make_drafter`` builds it)."""
    out = torch.zeros(len(rows), len(plans))
    for i, (row, lp) in enumerate(zip(rows, prompt_lens)):
        for s, plan in enumerate(plans):
            b, tree = plan
            n = (rounds_of(accepted_prefixes(drafter, target, row, lp, b), b) if tree is None
                 else greedy_rounds(target, wrapper, row[:lp], plan)[0])
            out[i, s] = n * t_round[plan]
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


def recipe_plans(recipe: HeadRecipe) -> list[Plan]:
    return [(b, None) for b in recipe.sizes] + [(b, t) for b, t in recipe.tree_plans]


def train_head(feats: torch.Tensor, times: torch.Tensor, recipe: HeadRecipe) -> BlockHead:
    torch.manual_seed(recipe.seed)
    plans = recipe_plans(recipe)
    head = BlockHead([p[0] for p in plans], feats.shape[1], recipe.hidden, trees=[p[1] for p in plans])
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
    """Total simulated time of the head's picks, of each fixed plan and of the per-prompt best."""
    pick = torch.tensor(head.pick(feats))  # [N]
    res = {f"fixed_{plan_label(p)}": float(times[:, s].sum()) for s, p in enumerate(head.plans)}
    res["head"] = float(times.gather(1, pick[:, None]).sum())
    res["best_per_prompt"] = float(times.min(dim=1).values.sum())
    return res


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dllm.drafters.base import make_drafter
    from dllm.drafters.dflash.io import load_dflash
    from dllm.models.targets import load_target
    from dllm.drafters.trees import make_tree_builder

    ap = argparse.ArgumentParser(prog="dllm train block-head", description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default=HeadRecipe.drafter)
    ap.add_argument("--prompts", type=int, default=HeadRecipe.prompts)
    ap.add_argument("--eval-from", type=int, default=8, help="first test instance per size of the evaluation")
    ap.add_argument("--eval-n", type=int, default=8, help="test instances per size of the evaluation")
    ap.add_argument("--trees", nargs="*", default=[], metavar="B/SPEC",
                    help="tree plans besides the chain sizes, e.g. 32/ddtree:budget=32 (block size / tree builder)")
    ap.add_argument("--threads", type=at_least(1), default=1, help="torch threads (default: 1)")
    ap.add_argument("--out", default="runs/block-head")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        tree_plans = tuple((int(t.split("/", 1)[0]), t.split("/", 1)[1]) for t in args.trees)
    except (ValueError, IndexError):
        ap.error(f"--trees takes BLOCK/SPEC plans such as 32/ddtree:budget=32, got {args.trees}")
    recipe = HeadRecipe(drafter=args.drafter, prompts=args.prompts, tree_plans=tree_plans)
    plans = recipe_plans(recipe)
    t0 = time.perf_counter()
    target, _ = load_target(recipe.target)
    target = target.float().eval()
    drafter = load_dflash(recipe.drafter).eval()
    wrapper = make_drafter("dflash", model=drafter)
    if max(p[0] for p in plans) > drafter.block_size:
        raise ValueError(f"plans {[plan_label(p) for p in plans]} exceed the drafter's trained block size "
                         f"{drafter.block_size}")
    for _, spec in recipe.tree_plans:
        make_tree_builder(spec)  # a bad spec fails here, before any work
    vocab = hf_tokenizer().get_vocab()
    mix = TaskMixture(LONG_MIXTURE, seed=recipe.seed + 1, tokenizer=hf_tokenizer())
    rng = mix.rng(-1)
    train_prompts = [[vocab[w] for w in T.prompt_words(mix.sample(rng))] for _ in range(recipe.prompts)]
    held = eval_examples(T.suite_task_names("long-answer"), per_size=args.eval_n, skip=args.eval_from)
    held_prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in held]
    t_round = round_times(target, wrapper, plans, train_prompts[:recipe.timing_prompts])
    print("ms per round:", {plan_label(p): round(v * 1e3, 3) for p, v in t_round.items()}, flush=True)
    taps = list(drafter.target_layer_ids)
    tables = {}
    for name, prompts in (("train", train_prompts), ("eval", held_prompts)):
        rows = regenerate(target, prompts, ANSWER_TOKENS)
        tables[name] = (features_of(target, taps, prompts),
                        time_table(drafter, target, rows, [len(p) for p in prompts], plans, t_round, wrapper))
    head = train_head(*tables["train"], recipe)
    report = {split: evaluate(head, *tables[split]) for split in tables}
    for split, res in report.items():
        base = min(v for k, v in res.items() if k.startswith("fixed_"))
        cells = ", ".join(f"{k} {base / v:.3f}x" for k, v in res.items())
        print(f"{split}: {cells} (speed vs the best fixed plan)")
    by_task: dict[str, list[str]] = {}
    for ex, p in zip(held, head.pick(tables["eval"][0])):
        by_task.setdefault(ex.task, []).append(plan_label(plans[p]))
    print("eval picks per task:", {k: sorted(set(v)) for k, v in by_task.items()})
    head.meta = {"drafter": recipe.drafter, "recipe": asdict(recipe),
                 "round_ms": {plan_label(p): v * 1e3 for p, v in t_round.items()},
                 "simulated": report, "seconds": round(time.perf_counter() - t0, 1)}
    out = head.save(args.out)
    print(f"wrote {out} ({json.dumps(report['eval'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
