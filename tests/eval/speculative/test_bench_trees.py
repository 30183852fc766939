"""``dllm.eval.speculative.trees``: draft-tree budgets chosen on a held-out split, on tiny random Qwen3 models."""

from __future__ import annotations

import json
import re

import pytest
import torch

from dllm import tasks as T
from dllm.cli import main as dllm_main
from dllm.eval.speculative import trees as B

from speculative_models import MASK, tiny_qwen3

BUDGETS = (4, 8)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from dllm.drafters.base import make_drafter
    from dllm.drafters.dflash.io import random_dflash, save_dflash

    root = tmp_path_factory.mktemp("bench_trees")
    target = tiny_qwen3(seed=0)
    target.save_pretrained(root / "target")
    save_dflash(random_dflash(target, 1, 8, MASK), root / "dflash")  # block 8: K = 7
    drafter = make_drafter("dflash", model=str(root / "dflash"))
    return target, drafter, {"target": str(root / "target"), "dflash": str(root / "dflash")}


def test_splits_are_disjoint_and_per_size():
    held, rep = B.held_out_examples(["copy_long"], 2), B.reported_examples(["copy_long"], 2)
    sizes = T.get_task("copy_long").default_sizes
    assert [e.size for e in rep] == [e.size for e in held] == [s for s in sizes for _ in range(2)]
    assert not {e.prompt for e in held} & {e.prompt for e in rep}
    assert rep == T.test_split("copy_long", None, n=2)
    assert held == [e for s in sizes for e in T.test_split("copy_long", s, n=4)[2:]]


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
def test_run_trees_chooses_on_held_out(models, monkeypatch):
    target, drafter, _ = models
    held, rep = T.test_split("copy_long", 32, n=2)[1:], T.test_split("copy_long", 32, n=1)
    seen_splits = []
    real_choose = B.choose_budgets

    def spy(rows):
        seen_splits.append({r.split for r in rows})
        return real_choose(rows)

    monkeypatch.setattr(B, "choose_budgets", spy)
    bench = B.run_trees(target, drafter, ["chain", "ddtree", "taps"], list(BUDGETS), held, rep,
                        temperatures=(0.0, 1.0), max_new_tokens=12, progress=False)
    assert seen_splits == [{"held-out"}]  # only held-out rows chose
    assert [(r.builder, r.budget) for r in bench.held_out] == \
        [("generate", None), ("no-tree", None)] + [(b, n) for b in ("chain", "ddtree", "taps") for n in BUDGETS]
    assert {r.temperature for r in bench.held_out} == {0.0}
    assert [(r.builder, r.budget, r.temperature) for r in bench.reported] == \
        [(c.builder, c.budget, t) for t in (0.0, 1.0) for c in B.configs_for(["chain", "ddtree", "taps"], BUDGETS)]
    for r in bench.held_out + bench.reported:
        assert r.status == "ok", (r.method, r.reason)
        assert r.prompts == 1 and r.target_forwards > 0 and r.tau == round(r.generated_tokens / r.target_forwards, 4)
        assert sum(r.prompt_forwards) == r.target_forwards and sum(r.prompt_tokens) == r.generated_tokens
        assert r.greedy_match is (True if r.temperature == 0 else None), r.method  # lossless
        assert r.greedy_diffs == []
        assert r.speedup is not None
    by = {(r.builder, r.budget, r.temperature): r for r in bench.reported}
    # near max_new_tokens the dflash drafter's last blocks are shorter (the dflash package's rule)
    assert by[("generate", None, 0.0)].width == 1.0 and 1.0 < by[("no-tree", None, 0.0)].width <= 8.0
    for n in BUDGETS:  # the forward's width: 1 + nodes (chain: min(budget, K = 7), K shorter near the cap)
        assert by[("ddtree", n, 0.0)].width == by[("taps", n, 0.0)].width == 1 + n
        assert 1.0 < by[("chain", n, 0.0)].width <= 1 + min(n, 7)
    # the choice: each builder's best held-out tokens/s, marked on both splits' rows of that budget
    assert set(bench.chosen) == {"chain", "ddtree", "taps"}
    for b, row in bench.chosen.items():
        held_rows = [r for r in bench.held_out if r.builder == b]
        assert row.split == "held-out" and row.tokens_per_s == max(r.tokens_per_s for r in held_rows)
        assert [r.budget for r in bench.reported if r.builder == b and r.chosen] == [row.budget] * 2
    assert not any(r.chosen for r in bench.reported if r.budget is None)
    assert all(s["split"] == "held-out" for s in bench.selection().values())
    with pytest.raises(ValueError, match="held-out split only"):
        real_choose(bench.reported)
    with pytest.raises(ValueError, match="disjoint"):
        B.run_trees(target, drafter, ["chain"], [4], rep, rep, progress=False)


def test_choose_budgets_uses_held_out_tokens_per_s():
    rows = [B.TreeRow("ddtree:budget=4", 0.0, split="held-out", builder="ddtree", budget=4, tokens_per_s=10.0),
            B.TreeRow("ddtree:budget=8", 0.0, split="held-out", builder="ddtree", budget=8, tokens_per_s=12.0),
            B.TreeRow("ddtree:budget=16", 0.0, split="held-out", builder="ddtree", budget=16, tokens_per_s=12.0),
            B.TreeRow("ddtree:budget=32", 1.0, split="held-out", builder="ddtree", budget=32, tokens_per_s=99.0),
            B.TreeRow("generate", 0.0, split="held-out", builder="generate", tokens_per_s=50.0)]
    assert {b: r.budget for b, r in B.choose_budgets(rows).items()} == {"ddtree": 8}  # greedy only; ties: smaller


def test_greedy_diffs_give_the_targets_margin(models):
    target, _, _ = models
    prompt, ref = [2, 5, 6, 7], [9, 10, 11]
    with torch.inference_mode():
        logits = target(torch.tensor([prompt + ref[:1]])).logits[0, -1]
    diffs = B.greedy_diffs(target, [prompt, prompt, prompt], [ref, [9, 12, 11], [9]], [ref, ref, ref])
    assert [(d["prompt"], d["position"], d["ours"], d["generate"]) for d in diffs] == [(1, 1, 12, 10), (2, 1, None, 10)]
    assert diffs[0]["logit_margin"] == pytest.approx(float(logits[10] - logits[12]), abs=1e-5)
    assert diffs[1]["logit_margin"] is None  # ours stopped early: nothing to compare
    row = B.TreeRow("ddtree:budget=4", 0.0, split="reported", builder="ddtree", budget=4, greedy_diffs=diffs[:1])
    assert "greedy mismatch ddtree:budget=4: prompt 1, generated position 1: token 12 vs generate's 10" in \
        B.format_diffs([row])


def test_cost_curve_of_a_sliding_window_target_is_refused():
    """Its 4-D masks span the whole cache, which a sliding-window layer does not keep: transformers raised
    a tensor size mismatch mid-measurement; now the error names the sliding-window layers at once."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, use_sliding_window=True,
                         sliding_window=4, max_window_layers=0)
    with pytest.raises(ValueError, match="sliding-window layers, which cannot verify the tree forwards"):
        B.forward_cost(Qwen3ForCausalLM(config).eval(), sizes=(0, 4), prefix=8, repeats=1, warmup=0)


def test_cost_curve(models):
    target, drafter, _ = models
    curve = B.forward_cost(target, prefix=20, repeats=3, warmup=1, taps=drafter.target_layers)
    assert curve.sizes == list(B.COST_SIZES) == [0, 1, 2, 4, 8, 16, 32, 64, 128]
    assert len(curve.ms) == len(curve.sizes) and all(m > 0 for m in curve.ms)
    assert all(len(s) == 3 for s in curve.samples_ms)
    # the fit is the least-squares line of the medians; its slope's sign is the machine's (a tiny
    # target on a loaded CPU can time 129 tokens no slower than 1), so it is not asserted
    a, b = B.fit_line([float(n) for n in curve.sizes], curve.ms)
    assert (curve.a_ms, curve.b_ms) == (pytest.approx(a, abs=1e-4), pytest.approx(b, abs=1e-5)) and curve.a_ms > 0
    # b_over_a is b/a of the unrounded fit, rounded to 6 decimals (so compare at that granularity)
    assert curve.b_over_a == pytest.approx(b / a, abs=6e-7)
    assert "fit t(N)" in curve.format() and "| 128 | 129 |" in curve.format()
    assert B.fit_line([0, 1, 2], [1.0, 3.0, 5.0]) == pytest.approx((1.0, 2.0))
    with pytest.raises(ValueError, match="two distinct"):
        B.fit_line([3, 3], [1.0, 2.0])


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
def test_main_via_dllm_bench_trees(models, tmp_path, capsys):
    _, _, paths = models
    out, png = tmp_path / "trees.json", tmp_path / "trees.png"
    rc = dllm_main(["bench", "trees", "--trees", "chain,ddtree,taps", "--budgets", "4,8", "--target", paths["target"],
                    "--dflash", paths["dflash"], "--tasks", "copy_long", "--n", "1", "--max-new-tokens", "10",
                    "--temperatures", "0", "--prefix", "16", "--cost-repeats", "2", "--no-progress",
                    "--out", str(out), "--png", str(png)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "held-out split" in printed and "reported split" in printed and "fit t(N)" in printed
    assert "| ddtree | 8 |" in printed and "budget selection" in printed
    payload = json.loads(out.read_text())
    assert payload["splits"]["held-out"]["prompts"] == payload["splits"]["reported"]["prompts"] == 3
    assert payload["block_size"] == 8 and payload["budgets"] == [4, 8]
    rows = payload["rows"]
    assert "outputs" not in rows[0]
    for split in ("held-out", "reported"):
        mine = [r for r in rows if r["split"] == split]
        assert [(r["builder"], r["budget"]) for r in mine] == \
            [("generate", None), ("no-tree", None)] + [(b, n) for b in ("chain", "ddtree", "taps") for n in (4, 8)]
        assert all(r["greedy_match"] is True and r["status"] == "ok" for r in mine)
    for b, sel in payload["selection"].items():
        assert sel["split"] == "held-out"
        held = {r["budget"]: r["tokens_per_s"] for r in rows if r["split"] == "held-out" and r["builder"] == b}
        assert held[sel["budget"]] == max(held.values())
        assert [r["budget"] for r in rows if r["split"] == "reported" and r["builder"] == b and r["chosen"]] == \
            [sel["budget"]]
    curve = payload["cost_curve"]
    assert curve["sizes"] == list(B.COST_SIZES) and len(curve["ms"]) == len(curve["sizes"])
    # the saved line is the least-squares fit of the saved medians (its sign is the machine's: with
    # 2 repeats on a loaded CPU the slope may come out <= 0, so the test does not ask for b > 0)
    a, b = B.fit_line([float(n) for n in curve["sizes"]], curve["ms"])
    assert curve["a_ms"] == pytest.approx(a, abs=1e-4) and curve["b_ms"] == pytest.approx(b, abs=1e-5)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the paired comparison: 3 pairs x 2 budgets at T = 0, on the 3 reported prompts
    assert "taps:budget=4 vs ddtree:budget=4 | 0 | 3 |" in printed
    assert [(p["a"], p["b"]) for p in payload["paired"]] == \
        [(f"{a}:budget={n}", f"{b}:budget={n}") for a, b in (("taps", "ddtree"), ("ddtree", "chain"), ("taps", "chain"))
         for n in (4, 8)]
    reported = {r["method"]: r for r in rows if r["split"] == "reported"}
    for p in payload["paired"]:
        ra, rb = reported[p["a"]], reported[p["b"]]
        assert p["n"] == 3 and p["tau_a"] == ra["tau"] and p["tau_b"] == rb["tau"] and p["low"] is None
        assert p["higher"] + p["equal"] + p["lower"] == 3
    for r in rows:
        assert sum(r["prompt_forwards"]) == r["target_forwards"] and sum(r["prompt_tokens"]) == r["generated_tokens"]


@pytest.mark.parametrize("argv, match", [
    (["--trees", "chain,medusa"], "valid builders: chain, ddtree, jetspec, taps"),
    (["--trees", "ddtree,ddtree"], "once"),
    (["--budgets", "16,0"], "budgets must be integers >= 1"),
    (["--budgets", "big"], "--budgets must be integers >= 1"),
    (["--n", "0"], "--n must be an integer >= 1"),
    (["--temperatures", "-1"], "temperatures must be finite numbers >= 0"),
    (["--tasks", "copy_lon"], "valid tasks: .*copy_long"),
    (["--cost-repeats", "0"], "--cost-repeats must be an integer >= 1"),
    (["--n", "26"], r"--n 26: the reported and held-out splits take 2n .* give --n <= 25"),
])
def test_bad_flags(argv, match, capsys):
    with pytest.raises(ValueError, match=match):
        B.parse_args(argv)
    assert dllm_main(["bench", "trees", "--trees", "chain", *argv]) == 2  # the same through dllm bench trees
    err = capsys.readouterr().err
    assert err.startswith("dllm bench trees: error: ") and re.search(match, err), err


def test_defaults():
    args = B.parse_args([])
    assert args.trees == ["chain", "ddtree", "taps"] and args.budgets == [16, 32, 64, 128]
    assert args.temperatures == [0.0, 1.0] and args.tasks == list(T.suite_task_names("long-answer"))
    assert args.block_size is None and args.prefix == 100


def _row(builder: str, forwards: list[int], tokens: list[int], budget: int = 8, temperature: float = 0.0,
         split: str = "reported"):
    return B.TreeRow(f"{builder}:budget={budget}", temperature, builder=builder, budget=budget, split=split,
                     prompt_forwards=forwards, prompt_tokens=tokens, target_forwards=sum(forwards),
                     generated_tokens=sum(tokens))


def test_paired_counts_and_interval():
    from dllm.eval.speculative.trees_report import format_paired, paired, paired_rows

    tokens = [40, 30, 50, 20, 60, 45]
    a, b = _row("taps", [5, 4, 6, 3, 7, 5], tokens), _row("ddtree", [5, 5, 6, 4, 7, 6], tokens)
    p = paired(a, b, resamples=500)
    assert (p.n, p.higher, p.equal, p.lower) == (6, 3, 3, 0)
    assert p.tau_a == pytest.approx(245 / 30) and p.tau_b == pytest.approx(245 / 33)
    assert 0 <= p.low <= p.delta <= p.high  # a never takes more forwards, so no resample favours b
    assert paired(a, b, resamples=500) == p  # seeded
    assert p.to_json()["delta"] == round(245 / 30 - 245 / 33, 4)
    same = paired(a, a, resamples=200)
    assert (same.delta, same.low, same.high, same.equal) == (0.0, 0.0, 0.0, 6)
    # fewer forwards on every prompt: the whole interval is above 0
    better = paired(_row("taps", [4, 3, 5, 2, 6, 4], tokens), b, resamples=500)
    assert better.low > 0 and (better.higher, better.lower) == (6, 0)
    # a mixed pair: the interval straddles 0
    c = _row("taps", [4, 6, 5, 5, 6, 7], tokens)
    mixed = paired(c, b, resamples=2000)
    assert mixed.low < 0 < mixed.high and (mixed.higher, mixed.equal, mixed.lower) == (3, 0, 3)
    # per-prompt tau, not forwards: at T > 0 the builders' outputs (and lengths) differ
    longer = paired(_row("taps", [6, 6, 6, 4, 7, 6], [60, 30, 50, 20, 60, 45]), b, resamples=10)
    assert (longer.higher, longer.equal, longer.lower) == (1, 4, 1)  # prompt 0: one forward more, yet 10 vs 8
    # too few prompts for an interval
    few = paired(_row("taps", [5, 4], [40, 30]), _row("ddtree", [5, 5], [40, 30]))
    assert few.low is few.high is None and few.to_json()["low"] is None
    # only pairs present at the same budget and temperature
    rows = [a, b, _row("chain", [9, 9, 9, 9, 9, 9], tokens), _row("taps", [5] * 6, tokens, budget=16),
            _row("ddtree", [5] * 6, tokens, temperature=1.0), _row("taps", [5] * 6, tokens, temperature=1.0)]
    found = paired_rows(rows)
    assert [(t, n, q.a, q.b) for t, n, q in found] == \
        [(0.0, 8, "taps:budget=8", "ddtree:budget=8"), (1.0, 8, "taps:budget=8", "ddtree:budget=8"),
         (0.0, 8, "ddtree:budget=8", "chain:budget=8"), (0.0, 8, "taps:budget=8", "chain:budget=8")]
    table = format_paired(found)
    assert "| taps:budget=8 vs ddtree:budget=8 | 0 | 6 | 8.167 | 7.424 | +0.742 | [+" in table
    assert format_paired(paired_rows([b])) is None
    assert "| n/a |" in format_paired(paired_rows([_row("taps", [5], [40]), _row("ddtree", [6], [40])]))


def test_paired_rejects_mismatched_rows():
    from dllm.eval.speculative.trees_report import paired, paired_rows

    a = _row("taps", [5, 4], [40, 30])
    with pytest.raises(ValueError, match=r"got 2 / 2 \(taps:budget=8\) and 3 / 3 \(ddtree:budget=8\)"):
        paired(a, _row("ddtree", [5, 4, 3], [40, 30, 20]))
    with pytest.raises(ValueError, match=r"got 2 / 2 \(taps:budget=8\) and 2 / 3"):
        paired(a, _row("ddtree", [5, 4], [40, 30, 20]))
    with pytest.raises(ValueError, match="resamples must be >= 1, got 0"):
        paired(a, a, resamples=0)
    with pytest.raises(ValueError, match="rows of one split.*'held-out' and 'reported'"):
        paired_rows([_row("taps", [5], [40], split="held-out"), _row("taps", [5], [40])])
