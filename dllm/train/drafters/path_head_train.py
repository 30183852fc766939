"""Train a path head (``dllm.drafters.trees.path_head``) for a DFlash drafter: the ``taps`` tree builder's
path-conditioned acceptance estimates.

    dllm train path-head --drafter tiny-ar-dflash --out runs/path-head --threads 2

1. Data: prompts from the long-answer mixture (test split held out), answers the target's own greedy
   continuations (``dflash_train.regenerate``); every answer position is an anchor, and one drafter
   pass per row (``dflash_train.block_pass``) gives the drafter's final states and marginals at the
   block's depths 1..K, teacher-forced, exactly as a greedy call sees them.
2. Examples: at depth d the node's parent is the target's token at d - 1 (the anchor at d = 1):
   the walk reaches a node only through the target's tokens, so P(target token at d | that path) is
   the node's acceptance. Inputs: the drafter's state at d, the parent, the drafter's arg-max at
   d - 1, the deviations (target token != arg-max) at depths 1..d-1; label: the target's token at d.
3. Cross-entropy, AdamW, a few epochs (the drafter is frozen; the head starts as its marginals).
4. Evaluation, teacher-forced on test instances ``--eval-from``.. (not those the benchmarks report
   by default): tau = 1 + the tree's nodes on the target's path, ddtree vs taps with the head, per
   budget; written into ``path_head.json`` (``meta.evaluation``) beside the weights (``--out``), ready to
   sit beside the drafter's checkpoint.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from dllm import tasks as T
from dllm.drafters.dflash.model import DFlashDrafter, target_embedding, target_head
from dllm.drafters.trees import Tree, make_tree_builder, on_path
from dllm.drafters.trees.path_head import PathHead, PathScorer
from dllm.scoring.exact_match import eval_examples
from dllm.options import check_int
from dllm.train.ar import LONG_MIXTURE, hf_tokenizer
from dllm.train.data import TaskMixture
from dllm.flags import at_least
from dllm.train.drafters.dflash_train import ANSWER_TOKENS, block_pass, regenerate


@dataclass(frozen=True)
class PathHeadRecipe:
    drafter: str = "tiny-ar-dflash"
    target: str = "tiny-ar"
    prompts: int = 1500  # training prompts from the long-answer mixture
    epochs: int = 3
    batch_size: int = 2048  # examples (nodes) per step
    width: int = 32  # 32, 64, 128 and 256 gave the same held-out tau (teacher-forced); 32 is the cheapest
    dropout: float = 0.1
    lr: float = 2e-3
    weight_decay: float = 0.01
    seed: int = 123  # the mixture's draw (the drafter recipes draw with seed 0)

    def __post_init__(self) -> None:
        for name in ("prompts", "epochs", "batch_size", "width"):
            check_int(name, getattr(self, name), 1)


@dataclass
class Anchors:
    """Every answer position of some rows as an anchor (A anchors in all)."""

    states: torch.Tensor  # [A, K, D] the drafter's final states at depths 1..K
    log_probs: torch.Tensor  # [A, K, V] its marginals
    truth: torch.Tensor  # [A, K] long, the target's tokens at depths 1..K, -1 past the answer's end
    anchor: torch.Tensor  # [A] long, the anchor tokens


@torch.no_grad()
def collect(drafter: DFlashDrafter, target, rows: Sequence[Sequence[int]], prompt_lens: Sequence[int]) -> Anchors:
    """The drafter's teacher-forced pass at every answer position of each row (one pass per row)."""
    parts: list[tuple[torch.Tensor, ...]] = []
    for row, lp in zip(rows, prompt_lens):
        ids = torch.tensor([list(row)])
        anchors = torch.arange(lp, len(row) - 1)[None]  # [1, A]
        if anchors.numel() == 0:
            continue
        out = block_pass(drafter, target, ids, torch.tensor([len(row)]), anchors)
        truth = torch.where(out.valid, out.labels, torch.full_like(out.labels, -1))[0]  # [A, K]
        parts.append((out.hidden[0], torch.log_softmax(out.logits[0], -1), truth, ids[0, anchors[0]]))
    if not parts:
        raise ValueError("no anchors: every row ended right after its prompt")
    return Anchors(*(torch.cat(p) for p in zip(*parts)))


def examples(data: Anchors) -> tuple[torch.Tensor, ...]:
    """(states [M, D], parent, parent_top, deviations, label [M]) of every depth whose token is known."""
    top = data.log_probs.argmax(-1)  # [A, K]
    first = data.anchor[:, None]
    parent = torch.cat([first, data.truth[:, :-1]], dim=1)  # [A, K]
    parent_top = torch.cat([first, top[:, :-1]], dim=1)
    deviates = ((data.truth != top) & (data.truth >= 0)).long()  # [A, K]
    deviations = torch.cumsum(deviates, dim=1) - deviates  # strictly above each depth
    keep = (data.truth >= 0) & (parent >= 0)
    return data.states[keep], parent[keep], parent_top[keep], deviations[keep], data.truth[keep]


def train_path_head(drafter: DFlashDrafter, target, data: Anchors, recipe: PathHeadRecipe,
                    progress: bool = True) -> PathHead:
    from tqdm.auto import tqdm

    torch.manual_seed(recipe.seed)
    embed = target_embedding(target).detach()
    head = PathHead(drafter.config.hidden_size, recipe.width, dropout=recipe.dropout).train()
    states, parent, parent_top, deviations, label = examples(data)
    opt = torch.optim.AdamW(head.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    lm_head = target_head(target)
    n = label.shape[0]
    for _ in tqdm(range(recipe.epochs), disable=not progress, desc="path head"):
        for idx in torch.randperm(n).split(recipe.batch_size):
            hidden = head(states[idx], parent[idx], parent_top[idx], deviations[idx], embed)
            loss = F.cross_entropy(drafter.compute_logits(hidden, lm_head).float(), label[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return head.eval()


def nodes_on_path(tree: Tree, truth: torch.Tensor) -> torch.Tensor:
    """[A] the tree's nodes on the target's path (what a greedy walk accepts), truth [A, K]."""
    on_truth = (tree.tokens == truth.gather(1, (tree.depths - 1).clamp(min=0))) & tree.valid  # [A, N]
    return on_path(tree, on_truth).sum(-1)


@torch.no_grad()
def teacher_forced_taus(head: PathHead, drafter: DFlashDrafter, target, data: Anchors,
                        budgets: Sequence[int], chunk: int = 128, taps: str = "") -> dict[str, dict[str, float]]:
    """Mean tau (1 + accepted nodes) over the anchors of ``data`` per budget: ddtree vs taps (head;
    ``taps``: more options of the builder, e.g. "candidates=4"). Anchors go ``chunk`` at a time."""
    embed, lm_head = target_embedding(target), target_head(target)
    out: dict[str, dict[str, float]] = {}
    for budget in budgets:
        row = {}
        for name in ("ddtree", "taps"):
            extra = f",{taps}" if taps and name == "taps" else ""
            builder, accepted = make_tree_builder(f"{name}:budget={budget}{extra}"), 0.0
            for rows in torch.arange(data.anchor.shape[0]).split(chunk):
                scorer = PathScorer(head, data.states[rows], data.anchor[rows], embed,
                                    lambda h: drafter.compute_logits(h, lm_head))
                tree = builder.build(data.log_probs[rows], scorer)
                accepted += float(nodes_on_path(tree, data.truth[rows]).sum())
            row[name] = 1.0 + accepted / data.anchor.shape[0]
        out[str(budget)] = row
    return out


def encode(target, examples_: Sequence[T.Example]) -> tuple[list[list[int]], list[int]]:
    """(prompt + the target's greedy answer, prompt length) per example."""
    vocab = hf_tokenizer().get_vocab()
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples_]
    return regenerate(target, prompts, ANSWER_TOKENS), [len(p) for p in prompts]


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dllm.drafters.dflash.io import load_dflash
    from dllm.models.targets import load_target

    ap = argparse.ArgumentParser(prog="dllm train path-head", description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default=PathHeadRecipe.drafter, help="DFlash checkpoint (embedded name or directory)")
    ap.add_argument("--target", default=PathHeadRecipe.target)
    ap.add_argument("--prompts", type=int, default=PathHeadRecipe.prompts)
    ap.add_argument("--epochs", type=int, default=PathHeadRecipe.epochs)
    ap.add_argument("--width", type=int, default=PathHeadRecipe.width, help="the head's MLP width")
    ap.add_argument("--eval-from", type=int, default=8, help="first test instance per size of the evaluation")
    ap.add_argument("--eval-n", type=int, default=4, help="test instances per size of the evaluation")
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--threads", type=at_least(1), default=1, help="torch threads (default: 1)")
    ap.add_argument("--out", default="runs/path-head")
    args = ap.parse_args(argv)
    recipe = PathHeadRecipe(drafter=args.drafter, target=args.target, prompts=args.prompts, epochs=args.epochs,
                            width=args.width)
    for b in args.budgets:
        check_int("budget", b, 1)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    target, _ = load_target(recipe.target)
    target = target.float().eval().requires_grad_(False)
    drafter = load_dflash(recipe.drafter).float().eval().requires_grad_(False)
    held = eval_examples(T.suite_task_names("long-answer"), per_size=args.eval_n, skip=args.eval_from)
    mix = TaskMixture(LONG_MIXTURE, seed=recipe.seed, tokenizer=hf_tokenizer())
    rng = mix.rng(-1)
    train = collect(drafter, target, *encode(target, [mix.sample(rng) for _ in range(recipe.prompts)]))
    evaluation_data = collect(drafter, target, *encode(target, held))
    print(f"anchors: train {train.anchor.shape[0]}, eval {evaluation_data.anchor.shape[0]} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    head = train_path_head(drafter, target, train, recipe)
    evaluation = teacher_forced_taus(head, drafter, target, evaluation_data, args.budgets)
    for budget, row in evaluation.items():
        print(f"budget {budget}: ddtree tau {row['ddtree']:.3f}, taps (head) tau {row['taps']:.3f} "
              f"({row['taps'] / row['ddtree']:.4f}x)")
    head.meta = {"drafter": recipe.drafter, "recipe": asdict(recipe),
                 "evaluation": {"split": f"long-answer test instances {args.eval_from}.."
                                         f"{args.eval_from + args.eval_n - 1} per size, teacher-forced",
                                "tau": evaluation},
                 "seconds": round(time.perf_counter() - t0, 1)}
    out = head.save(args.out)
    print(f"wrote {out} ({json.dumps(evaluation)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
