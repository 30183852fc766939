"""T > 0 losslessness on targets small enough to enumerate.

1. Table toy (2e5 samples, the batched verification functions exactly as the loop chains them):
   target p(. | prefix) and drafter q(. | prefix) are fixed random tables over V = 6 tokens; L = 3
   new tokens are generated in rounds of K = 2 drafts (block 3: accepted drafts + the recovered or
   bonus token, cut at L). The histogram of the 216 possible outputs must match the target's exact
   sequence distribution: TV < 0.0125, where sampling noise alone gives 0.004 (T = 0.8, top-k 4,
   top-p 0.9) to 0.0085 (T = 1) (``null_tv``; measured 0.003-0.0096 over seeds; the noise's standard
   deviation is ~0.0007). A verifier with a wrong residual (p instead of norm(max(0, p - q)))
   measured TV 0.14-0.22: the threshold has power.
2. End to end (``speculative_generate`` on a tiny random Qwen3 with V = 8, 3 new tokens, 4e4 rows
   of one prompt in one batched call): TV < 0.03 against the target's exact distribution over the
   512 outputs, where noise alone gives 0.0217 (sd ~0.0015; measured 0.019-0.024); for
   full-distribution drafts (q != p), one-hot arg-max drafts, the n-gram drafter, and random DFlash
   and DFlash 2 drafters sampling their drafts (the reference's T > 0 rule), and DDTree / TAPS draft
   trees built from a DFlash drafter's marginals (the walk draws from p at each node).
"""

import functools
import itertools

import pytest
import torch

from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.drafters.verify import SamplingParams, sample_categorical, speculative_verify, target_probs
from tests.drafters.speculative_helpers import OracleDrafter, TableDrafter, null_tv, tiny_target, tv_distance

V, L, K = 6, 3, 2
N_TOY = 200_000
TOY_TV = 0.0125
SETTINGS = [SamplingParams(1.0), SamplingParams(0.8, top_k=4, top_p=0.9)]


class Toy:
    """Prefix-indexed tables: row ``offset[len] + value`` (value = the prefix read in base V) for
    prefixes shorter than L; one extra uniform row for the positions past L (cut anyway)."""

    def __init__(self, params: SamplingParams, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.offset = [sum(V ** i for i in range(n)) for n in range(L + 1)]  # [0, 1, 7, 43]
        rows = self.offset[L]
        self.p = torch.cat([target_probs(torch.randn((rows, V), generator=g) * 1.5, params),
                            torch.full((1, V), 1.0 / V)])  # [rows + 1, V]
        self.q = torch.cat([(torch.randn((rows, V), generator=g) * 1.5).softmax(-1),
                            torch.full((1, V), 1.0 / V)])

    def row(self, length: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        off = torch.tensor(self.offset)[length.clamp(max=L - 1)]
        return torch.where(length < L, off + value, torch.full_like(value, self.offset[L]))

    def exact(self) -> torch.Tensor:
        """[V ** L] the target's probability of every output, indexed by its base-V value."""
        probs = torch.ones(V ** L, dtype=torch.float64)
        for idx, seq in enumerate(itertools.product(range(V), repeat=L)):
            value = 0
            for n, tok in enumerate(seq):
                probs[idx] *= float(self.p[self.offset[n] + value, tok])
                value = value * V + tok
        return probs

    def simulate(self, n: int, *, one_hot: bool, generator: torch.Generator, ragged: bool = False,
                 residual_bug: bool = False) -> torch.Tensor:
        """n outputs of the speculative process; returns their base-V values [n]."""
        length = torch.zeros(n, dtype=torch.long)
        value = torch.zeros(n, dtype=torch.long)
        while bool((length < L).any()):
            draft, qs, pos_rows = [], [], [self.row(length, value)]
            v, ln = value.clone(), length.clone()
            for _ in range(K):  # draft K tokens from q along the drafted prefix
                q = self.q[pos_rows[-1]]  # [n, V]
                d = q.argmax(-1) if one_hot else sample_categorical(q, generator)
                draft.append(d)
                qs.append(q)
                v, ln = v * V + d, ln + 1
                pos_rows.append(self.row(ln, v))
            draft_t = torch.stack(draft, 1)  # [n, K]
            p = self.p[torch.stack(pos_rows, 1)]  # [n, K + 1, V]
            q_t = None if one_hot else torch.stack(qs, 1)  # [n, K, V]
            lengths = torch.randint(0, K + 1, (n,), generator=generator) if ragged else None
            acc, nxt = speculative_verify(draft_t, p, q_t, generator=generator, lengths=lengths)
            if residual_bug:  # a wrong verifier: on rejection draw from p instead of the residual
                p_at = p.gather(1, acc[:, None, None].expand(n, 1, V)).squeeze(1)
                nxt = sample_categorical(p_at, generator)
            for i in range(K + 1):  # commit d_1..d_acc, then next; cut at L
                tok = nxt if i == K else torch.where(i < acc, draft_t[:, i], nxt)
                take = (i <= acc) & (length < L)
                value = torch.where(take, value * V + tok, value)
                length = length + take.long()
        return value


@pytest.mark.parametrize("params", SETTINGS, ids=["T1", "T0.8-k4-p0.9"])
@pytest.mark.parametrize("one_hot", [True, False], ids=["onehot", "fullq"])
def test_toy_distribution_matches_the_target(params, one_hot):
    toy = Toy(params)
    exact = toy.exact()
    out = toy.simulate(N_TOY, one_hot=one_hot, generator=torch.Generator().manual_seed(7), ragged=not one_hot)
    tv = tv_distance(torch.bincount(out, minlength=V ** L), exact)
    assert null_tv(exact, N_TOY) < 0.75 * TOY_TV  # the threshold sits ~5 sd above pure sampling noise
    assert tv < TOY_TV, f"TV {tv:.4f} >= {TOY_TV} (noise alone ~{null_tv(exact, N_TOY):.4f})"


def test_toy_threshold_catches_a_wrong_residual():
    toy = Toy(SETTINGS[0])
    out = toy.simulate(N_TOY, one_hot=False, generator=torch.Generator().manual_seed(7), residual_bug=True)
    tv = tv_distance(torch.bincount(out, minlength=V ** L), toy.exact())
    assert tv > 2 * TOY_TV, f"a wrong residual gave TV {tv:.4f}: the test would not notice it"


# ---- end to end -------------------------------------------------------------------------------------
E2E_V, E2E_NEW, E2E_N, E2E_TV = 8, 3, 40_000, 0.03
PROMPT = [1, 5, 3]


def exact_target_distribution(target, params: SamplingParams) -> torch.Tensor:
    """[V ** 3] probability of each 3-token continuation of PROMPT (base-V index), from
    full forwards over all prefixes (no cache, one batch per depth)."""
    probs = torch.ones(1, dtype=torch.float64)
    prefixes = torch.tensor([PROMPT])
    with torch.no_grad():
        for _ in range(E2E_NEW):
            p = target_probs(target(prefixes).logits[:, -1], params).double()  # [P, V]
            probs = (probs[:, None] * p).reshape(-1)
            prefixes = torch.cat([prefixes.repeat_interleave(E2E_V, 0),
                                  torch.arange(E2E_V).repeat(prefixes.shape[0])[:, None]], dim=1)
    return probs


@pytest.fixture(scope="module")
def small_target():
    return tiny_target(vocab=E2E_V, hidden=32, eos=None, init=0.1, seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["fullq", "onehot", "ngram", "dflash", "dflash2", "dflash+ddtree", "dflash+taps",
                                     "dflash+taps-head"])
def test_end_to_end_distribution_matches_the_target(small_target, drafter):
    params = SamplingParams(0.9, top_k=6, top_p=0.95)
    exact = exact_target_distribution(small_target, params)
    tree = None
    if "+" in drafter:  # a draft tree (budget 5 nodes over K = 2 depths) built from the drafter's marginals
        drafter, builder = drafter.split("+")
        tree = "taps:estimator=head,budget=5" if builder == "taps-head" else f"{builder}:budget=5"
    if drafter.startswith("dflash"):  # a random DFlash (2) drafter sampling its drafts (full q)
        from dllm.drafters.base import make_drafter
        from dllm.drafters.dflash.dflash2.io import random_dflash2
        from dllm.drafters.dflash.io import random_dflash

        build = random_dflash if drafter == "dflash" else functools.partial(
            random_dflash2, conv_kernel_size=2, conv_group_size=16, selector_top_k=4, selector_rank=4)
        d = make_drafter("dflash", model=build(small_target.config, 1, 3, E2E_V - 1, seed=5))
        if tree is not None and "estimator=head" in tree:  # taps with a (random, non-zero) path head
            from dllm.drafters.trees.path_head import PathHead

            d.path_head = PathHead(small_target.config.hidden_size, width=16).eval()
            torch.nn.init.normal_(d.path_head.fc2.weight, std=1.0, generator=torch.Generator().manual_seed(2))
    else:
        d = {"fullq": TableDrafter(E2E_V, scale=0.5), "onehot": OracleDrafter(small_target),
             "ngram": "ngram:max_ngram=1"}[drafter]
    out = speculative_generate(small_target, d, [PROMPT] * E2E_N, max_new_tokens=E2E_NEW,
                               plan=Plan(block_size=3, tree=tree), temperature=params.temperature, top_k=params.top_k,
                               top_p=params.top_p, seed=11)
    gen = torch.tensor(out.generated)  # [N, 3]: no EOS, every row reaches max_new_tokens
    index = (gen * torch.tensor([E2E_V ** 2, E2E_V, 1])).sum(1)
    tv = tv_distance(torch.bincount(index, minlength=E2E_V ** E2E_NEW), exact)
    assert null_tv(exact, E2E_N) < 0.75 * E2E_TV  # ~5 sd of the noise below the threshold
    assert tv < E2E_TV, f"TV {tv:.4f} >= {E2E_TV} (noise alone ~{null_tv(exact, E2E_N):.4f})"
    assert out.tau > 1.0  # some drafts were accepted, so verification was exercised
