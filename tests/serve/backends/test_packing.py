"""Which pending forwards share a call: the least modelled cost, within the bounds, each forward once."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm.serve.backends.scheduling.packing import call_cost, plan_merges


@dataclass(frozen=True, eq=False)
class Fwd:
    rows: int
    length: int
    mergeable: bool = True


def plan_cost(calls, fixed):
    return sum(call_cost(sum(f.rows for f in c), max(f.length for f in c), fixed) for c in calls)


def set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield part[:i] + [[first, *part[i]]] + part[i + 1:]


FORWARDS = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 40)), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(FORWARDS, st.integers(0, 200))
def test_the_plan_is_the_cheapest_of_all_partitions(shapes, fixed):
    items = [Fwd(r, t) for r, t in shapes]
    calls = plan_merges(items, max_rows=10**6, max_tokens=10**9, fixed_cost=fixed)
    assert sorted(id(f) for c in calls for f in c) == sorted(id(f) for f in items)  # each forward once
    best = min(plan_cost(p, fixed) for p in set_partitions(items))
    assert plan_cost(calls, fixed) == best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 50), st.booleans()), min_size=1, max_size=20),
       st.integers(1, 12), st.integers(1, 300), st.integers(0, 500))
def test_bounds_hold_and_unmergeable_forwards_run_alone(shapes, max_rows, max_tokens, fixed):
    items = [Fwd(r, t, m) for r, t, m in shapes]
    calls = plan_merges(items, max_rows=max_rows, max_tokens=max_tokens, fixed_cost=fixed)
    assert sorted(id(f) for c in calls for f in c) == sorted(id(f) for f in items)
    alone = [f for f in items if not f.mergeable]
    assert [c[0] for c in calls[:len(alone)]] == alone and all(len(c) == 1 for c in calls[:len(alone)])
    for c in calls:
        if len(c) > 1:  # a forward over the bounds by itself runs alone; merged calls keep them
            rows = sum(f.rows for f in c)
            assert rows <= max_rows and rows * max(f.length for f in c) <= max_tokens
            assert all(f.mergeable for f in c)


def test_the_call_cost_trades_padding_against_calls():
    short, long_ = [Fwd(4, 10) for _ in range(2)], [Fwd(4, 40) for _ in range(2)]
    items = [short[0], long_[0], short[1], long_[1]]
    free = plan_merges(items, max_rows=64, max_tokens=10**6, fixed_cost=0)
    assert free == [short, long_]  # calls cost nothing: no padding (equal lengths share a call)
    dear = plan_merges(items, max_rows=64, max_tokens=10**6, fixed_cost=10**4)
    assert dear == [short + long_]  # calls cost more than any padding: one call
    # 8 rows padded from 10 to 40 columns cost 240 tokens: merge only when a call costs more
    assert len(plan_merges(items, max_rows=64, max_tokens=10**6, fixed_cost=239)) == 2
    assert len(plan_merges(items, max_rows=64, max_tokens=10**6, fixed_cost=241)) == 1


def test_no_forward_is_an_empty_plan():
    assert plan_merges([], max_rows=4, max_tokens=100, fixed_cost=10) == []


@pytest.mark.parametrize("rows,tokens", [(3, 10**6), (64, 90)])
def test_equal_lengths_split_at_the_bounds(rows, tokens):
    items = [Fwd(1, 30) for _ in range(7)]
    calls = plan_merges(items, max_rows=rows, max_tokens=tokens, fixed_cost=10)
    assert [len(c) for c in calls] == [3, 3, 1]
