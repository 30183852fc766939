"""``block``: the exact cache of block-causal models (SDAR, arXiv 2510.06303), and the cache checks
every ``generate`` call on such a model goes through (``policy_for_model``; its blocks are
``dllm.schedule.plan_block_causal``).

A block-causal model attends bidirectionally inside a block of ``bs`` positions (``block(p) = p //
bs`` of the RoPE positions) and causally across blocks. The keys/values of a column depend only on
the tokens of its own block and the blocks before it, so once a block holds no mask its K/V are
final: reusing them is exact, not an approximation (unlike ``prefix`` / ``dual`` on a bidirectional
model, whose keys drift as later tokens are committed). Its queries stop at the block's end, so a
sampler that reads logits right of the block (``Sampler.reads_right_of_block``: ``prophet``, ``klass``)
decides from fewer columns than without a cache.

Blocks follow the model's grid, which starts at position 0 of the prompt: the prompt's last
``n % bs`` tokens share a grid block with the first generated columns. The engine's first block is
that partial block (``[0, (-n) % bs)`` of the generated region), then blocks of ``bs``; the last may
be shorter. With block ``[s, e)`` of grid block ``[g, e)`` (``g <= s``: the prompt tail) the queries
of the policy are:

- the block's first step: columns ``[g_prev, e)`` where ``[g_prev, g)`` is the previous grid block,
  now complete: one forward recomputes its K/V from its final tokens (exact from then on) and
  decodes the new block; the call's first block queries ``[0, e)``, the prompt's prefill;
- every later step: ``[g, e)`` (the whole grid block: the prompt tail's K/V change with the block's
  tokens), attending to keys ``[0, e)``. Columns right of ``e`` are never attended (block-causal).
  A shifted model (``logit_shift = 1``, Fast-dLLM v2, arXiv 2509.26328) predicts column g from the
  row at g - 1, the previous block's last column, so its later steps query ``[g - 1, e)``: that
  column's K/V are final, and recomputing them writes the same values.

``generate.py`` of SDAR does the same work with one more forward per block (``store_kv=True`` over
the finished block before the next one starts); here it rides in the next block's first forward,
so each block costs its steps only. Cost per row: ``e - g_prev`` query rows at a block start, ``e -
g`` at a later step, against ``L`` (``none``) or ``L`` at a block start plus ``e - s`` (``dual``).

The approximate policies (``prefix``, ``dual``, ``window``, ``drift``, and ``auto`` with options) are
refused for block-causal models, with the reason: they would serve the prompt tail's stale keys in the
first block and pay full forwards for keys that are exact anyway. ``auto`` without options, the
recommended policy, is ``block`` for these models.
"""

from __future__ import annotations

from typing import Any, Optional

from dllm.cache.base import CachePolicy, Query, register_cache
from dllm.options import SettingError
from dllm.schedule import grid_start
from dllm.state import DecodeState


def block_size_of(model: Any) -> Optional[int]:
    """The trained block of a block-causal model, None for a bidirectional one."""
    config = getattr(model, "config", None)
    if not getattr(config, "block_causal", False):
        return None
    return int(config.block_size)


@register_cache("block", description="exact cache of block-causal models (SDAR): finished blocks' "
                "keys/values kept, the current grid block recomputed")
class BlockCausalCache(CachePolicy):
    """Exact for block-causal models: K/V of finished blocks reused, the current grid block recomputed."""

    def check(self, model, *, block_length: int, gen_length: int) -> None:
        if block_size_of(model) is None:
            raise SettingError(
                "cache", f"cache 'block' reuses the keys/values of finished blocks, which is exact only for a "
                f"block-causal model (SDAR); {getattr(model, 'display_name', type(model).__name__)} attends "
                f"bidirectionally, so its keys change whenever a later token is committed; use cache "
                f"'none' (exact) or an approximate policy ('prefix', 'dual', 'window', 'drift')")

    def query(self, state: DecodeState, block_step: int, shift: int) -> Query:
        s, e = state.block_start, state.block_end
        g = grid_start(state, s)
        if block_step > 0:  # a shifted model (Fast-dLLM v2) predicts column g from g - 1, whose K/V are final
            return Query(max(0, g - shift), e, e)
        if state.block_index == 0:
            return Query(0, e, e)  # the prefill: every prompt block, then the first block
        assert state.block_length is not None
        return Query(max(0, g - state.block_length), e, e)  # the finished grid block's final K/V, then ours

    def cached_query(self, state: DecodeState, shift: int) -> Query:
        """A later step of the block (what verification variants reproduce)."""
        return Query(max(0, grid_start(state, state.block_start) - shift), state.block_end, state.block_end)


EXACT_FOR_BLOCK_CAUSAL = ("none", "block")


def policy_for_model(model: Any, policy: CachePolicy) -> CachePolicy:
    """The policy a call on ``model`` runs: ``policy`` itself on a bidirectional model. On a
    block-causal one, ``auto`` without options (the recommended policy) is ``block`` (exact, and the
    fewest rows forwarded), and an approximate policy is refused (``refuse_policy``)."""
    if block_size_of(model) is None:
        return policy
    if policy.name == "auto" and policy.spec == "auto":
        return BlockCausalCache()
    refuse_policy(model, policy)
    return policy


def refuse_policy(model: Any, policy: CachePolicy) -> None:
    """ValueError when ``policy`` is an approximate cache and ``model`` is block-causal."""
    if isinstance(policy, BlockCausalCache) or not policy.uses_kv:
        return
    bs = block_size_of(model)
    raise SettingError(
        "cache", f"cache policy {policy.name!r} is refused for {getattr(model, 'display_name', 'this model')}: it "
        f"attends block-causally (block {bs}), so the keys/values of finished blocks are exact and "
        f"cache 'block' keeps them at no approximation; {policy.name!r} approximates a bidirectional "
        f"model's drifting keys, would serve the prompt tail's stale keys inside the first block, and "
        f"pays full forwards for keys that never change. Valid for this model: "
        f"{', '.join(EXACT_FOR_BLOCK_CAUSAL)}")


__all__ = ["BlockCausalCache", "EXACT_FOR_BLOCK_CAUSAL", "block_size_of", "policy_for_model", "refuse_policy"]
