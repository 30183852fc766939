"""``speculative_generate``: one lossless draft-then-verify loop for any transformers causal LM.

    prefill the prompts (left-padded)                  -> first token per row from the target
    while rows run:
        draft  = drafter proposes K = B - 1 tokens after each row's anchor (last committed token)
        logits = target([anchor, d_1..d_K]) with its DynamicCache           # one forward, B tokens
        accepted, next = verify(draft, logits)          # greedy, or exact speculative sampling
        commit d_1..d_accepted, next (cut at EOS / a stop string / max_new_tokens); crop the cache
        rows that stopped leave the batch

Every round commits at least one token per running row (the recovered or bonus token), so a call
takes at most ``max_new_tokens`` rounds. ``verify.py`` has the acceptance rules; with them the output
at T = 0 is the target's greedy output and at T > 0 it has the target's sampling distribution.

Batching (ragged prompts, ragged acceptance): ONE DynamicCache for the batch, with per-row holes.
Each round every row writes its B block tokens into the same B new slots; afterwards a row's
rejected slots are masked out (a 2-D attention mask over the cache slots, kept here as ``valid``
[R, S]) and the cache is cropped to the longest advance of the round. Positions are explicit per
row, so a row computes what it computes alone; attention is causal over slots, which keeps every
row's own order. Cost: slots that are holes in a row still take memory and attention work; the
cache grows by the round's longest advance, not each row's. When the columns that are holes in
every row exceed a quarter of the cache (and a block), ``compact`` gathers each row's valid slots to
the right (one pass over the cache). Finished rows leave the batch (``batch_select_indices``).
Batch size 1 has no holes at all. With per-row block sizes (``plan="auto"``, a block head picking
each row's B after the prefill; ``plan.py``) a round forwards the largest B of its running rows and
verifies each row's own ``B - 1`` drafts (``verify``'s per-row lengths), so a row alone runs its own B.
A drafter of dynamic length (``failfast``) gives per-row ``Draft.lengths`` and a chain only as wide as
its longest row (W <= K): the round then forwards ``[anchor, d_1..d_W]``.

One round body: a chain of K drafts is the width-1 tree. A tree round forwards ``[anchor, nodes]``
with an ancestor-only mask and walks it (``trees/verify.py``); a chain round forwards
``[anchor, d_1..d_K]`` under the causal order of its slots and verifies with ``verify.py`` (exact
speculative sampling of a chain); both give an accepted path of node indices, and everything after
(commit, cache rows, the drafter's next features) reads that path.

Near ``max_new_tokens`` a ``dflash`` row drafts only what it can still emit: K = min(B - 1, tokens
left), as the ``dflash`` package's ``dflash_generate`` shortens its last block (so acceptance is
equal round by round at batch 1; in a batch the round drafts the largest such K and each row's
verification is capped at its own). Other drafters (``Drafter.trims_last_block`` False) draft B - 1
every round; drafts past the cap are never emitted.

Host syncs (ours): one per round, on purpose: the accepted counts, the draft and the next tokens
come back together (``tolist``) because the per-row bookkeeping (stops, stop strings, the crop
length, the next round's inputs) is host-side Python; the prefill reads the first tokens the same
way. Everything else the loop needs on the host (lengths, the compaction width) is kept there.
Not ours: transformers' mask construction may read the mask back, and a drafter may sync (``dlm``
runs ``dllm.generate``; ``ngram`` builds its draft from the host lists).

One prompt with a chain plan on a Qwen3 / Qwen2 / Llama target runs ``fast_loop.FastRun`` instead
(a static KV buffer, no slot mask, no crop; the same tokens and acceptance; ``fast_path=False`` opts out).
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import torch

from dllm.drafters.base import Draft, DraftSetup, DrafterSpec, make_drafter
from dllm.drafters.fast_path.fast_loop import FastRun, fast_path_issue
from dllm.drafters.output import SpeculativeOutput, pack_sequences
from dllm.drafters.plan import Plan, RowPlans, as_plan, head_row_plans, unexpected_keywords
from dllm.drafters.stops import StopRule, stop_strings
from dllm.drafters.rounds import RoundState
from dllm.drafters.target import (Target, cache_length, check_positions, check_tokenizer, check_tree_room, compact,
                                  crop_to, select_rows)
from dllm.drafters.verify import SamplingParams, next_tokens, verify
from dllm.inputs import Prompts, prompt_rows
from dllm.models.text.tokenizer import encode_text
from dllm.options import check_bool, check_int
from dllm.settings import check_call_seed

if TYPE_CHECKING:
    from dllm.drafters.dflash.block_head import BlockHead


def speculative_generate(
    target,
    drafter: DrafterSpec,
    prompts: Prompts,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    plan: Union[Plan, int, str, "BlockHead", None] = None,
    stop: Union[str, Sequence[str], None] = None,
    seed: Optional[int] = None,
    eos_token_id: Union[int, Sequence[int], None] = None,
    tokenizer: Any = None,
    return_stats: bool = True,
    callback: Optional[Callable[[list[list[int]]], None]] = None,
    fast_path: bool = True,
    **unknown: Any,
) -> Union[SpeculativeOutput, torch.Tensor]:
    """Generate up to ``max_new_tokens`` tokens per prompt with ``target``, drafted by ``drafter``.

    Args:
        target: a transformers causal LM (``AutoModelForCausalLM``; Qwen3, Qwen2, Llama, ...) whose
            cache is a croppable ``DynamicCache``.
        drafter: a registered drafter name, spec string (``"ngram:max_ngram=4"``), mapping or
            ``Drafter`` instance (``dllm.drafters.list_drafters()``).
        prompts: a string, a list of strings (need a tokenizer; words it does not know are an error,
            as in ``dllm.generate``), a list of token-id lists (ragged), or a LongTensor [B, Lp]
            (rows taken as unpadded) / [Lp].
        max_new_tokens: most generated tokens per row (a stop token included); the longest prompt
            plus this must fit the target's ``max_position_embeddings``.
        temperature, top_p, top_k: the target's sampling settings, applied as transformers does
            (temperature, then top-k, then top-p); temperature 0 is greedy.
        plan: what a round verifies (``plan.py``): a ``Plan(block_size=, tree=)``, an int block size
            B (the anchor and K = B - 1 drafts; default the drafter's; B = 1 is plain autoregressive
            decoding through the same loop), ``"auto"`` (each row's plan picked after the prefill by
            the drafter's block head, a DFlash checkpoint with ``block_head.json``) or a
            ``BlockHead``. A Plan's ``tree`` (``"ddtree:budget=32"``, ``dllm.drafters.trees``): verify
            a draft tree built from the drafter's per-position distributions in one forward
            (``trees/verify.py``) instead of the drafted chain; None = the chain. A head whose plans
            include draft trees also picks chain or tree; the call's rows share the one most of them
            picked (its rows then run the largest picked B). The plan is the only way to give the
            block size and the tree: ``block_size=`` or ``tree=`` is a TypeError saying so.
        stop: stop string(s); a row ends with the token that completes one (needs a tokenizer).
        seed: seeds a private ``torch.Generator`` for every random draw (None: the global RNG).
        eos_token_id: id(s) that end a row (default None: the target's generation config, then its
            config; [] = none).
        tokenizer: for string prompts, stop strings and ``texts`` (default: ``target.tokenizer``);
            its tokens must fit the target's vocabulary.
        return_stats: True returns a ``SpeculativeOutput``; False only its ``sequences`` [B, Lp + G].
        callback: called after every round with each row's generated ids so far (a new list per prompt,
            the callback's to keep or edit; accepted tokens are final, so a server streams them); an
            exception it raises ends the call.
        fast_path: one prompt with a chain plan on a Qwen3 / Qwen2 / Llama target runs the batch-1
            round of ``fast_path/fast_loop.py`` (a static KV buffer, one host sync per round; same tokens);
            False always runs the general loop (the reference the fast path is tested against).
    """
    t_start = time.perf_counter()
    if unknown:
        raise unexpected_keywords("speculative_generate", list(unknown))
    params = SamplingParams(temperature, top_k, top_p)
    check_int("max_new_tokens", max_new_tokens, 1)
    check_bool("return_stats", return_stats)
    check_bool("fast_path", fast_path)
    check_call_seed(seed)
    the_plan = as_plan(plan)
    drafter_obj = make_drafter(drafter)
    from dllm.drafters.trees.builders import make_tree_builder

    builder = None if the_plan.tree is None else make_tree_builder(the_plan.tree)
    tokenizer = tokenizer if tokenizer is not None else getattr(target, "tokenizer", None)
    tgt = Target(target, taps=drafter_obj.target_layers, eos_token_id=eos_token_id, tokenizer=tokenizer)
    head = _block_head(the_plan.head, drafter_obj)
    block = max(head.sizes) if head is not None else (
        drafter_obj.block_size if the_plan.block_size is None else the_plan.block_size)
    check_int("block_size", block, 1, hint=" (the anchor plus block_size - 1 drafts), or 'auto'")
    drafter_obj.check_target(tgt.info)
    check_tokenizer(tokenizer, tgt.info.vocab_size)
    encode = None if tokenizer is None else partial(encode_text, tokenizer)
    rows = prompt_rows(prompts, encode, tgt.info.vocab_size, vocab_name="the target's vocabulary ")
    longest = max(len(r) for r in rows) + max_new_tokens
    check_positions(target, max(len(r) for r in rows), max_new_tokens)
    head_trees = {spec: make_tree_builder(spec) for spec in ([] if head is None else head.tree_specs)}
    for b in [builder, *head_trees.values()]:
        if b is not None:
            tgt.check_tree(f"the draft trees of {b.spec!r}")
            check_tree_room(b, target, longest)
            b.check_drafter(drafter_obj)
    stops = StopRule(frozenset(tgt.info.eos_ids), max_new_tokens, stop_strings(stop, tokenizer), tokenizer)
    generator = None if seed is None else torch.Generator(device=tgt.device).manual_seed(seed)
    wants_paths = any(getattr(b, "uses_paths", False) for b in [builder, *head_trees.values()] if b is not None)
    setup = DraftSetup(target=target, info=tgt.info, block_size=block, batch_size=len(rows), params=params,
                       generator=generator, device=tgt.device, paths=wants_paths)
    fast = fast_path and fast_path_issue(target, len(rows), builder, head) is None
    run = (FastRun(tgt, drafter_obj.begin(setup), rows, block, params, generator, stops, length=longest + block)
           if fast else _Run(tgt, drafter_obj.begin(setup), rows, block, params, generator, stops))
    run.trim = drafter_obj.trims_last_block
    run.plans = RowPlans(sizes=[block] * len(rows), tree=None, builder=builder)
    run.head, run.head_trees = head, head_trees
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable (called with each row's generated ids after every round) "
                        f"or None, got {type(callback).__name__}")
    with torch.inference_mode():
        run.prefill()
        while run.active:
            run.round()
            if callback is not None:  # copies: the loop's own lists grow after the call (and must not be edited)
                callback([list(g) for g in run.generated])
    sequences, lp = pack_sequences(rows, run.generated, tgt.info.pad_id)
    if not return_stats:
        return sequences
    texts = None
    if tokenizer is not None:
        texts = [tokenizer.decode(g, skip_special_tokens=True) for g in run.generated]
    picked = head is not None
    return SpeculativeOutput(
        sequences=sequences, prompt_length=lp, generated=run.generated, texts=texts,
        stop_reasons=run.reasons, acceptance=run.acceptance, block_size=block,
        row_block_sizes=list(run.plans.sizes) if picked else None,
        row_trees=[run.plans.tree] * len(rows) if picked else None,
        target_forwards=run.target_forwards, drafter_forwards=run.drafter_forwards, rounds=run.rounds,
        wall_time=time.perf_counter() - t_start,
    )


# ---- the loop ------------------------------------------------------------------------------------------
class _Run(RoundState):
    """The general loop's state: ``RoundState`` plus the tensors of the R rows still running, in
    ``active`` order: the cache, its ``valid`` slot mask, pending features."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cache = self.target.new_cache(len(self.tokens))
        self.valid: Optional[torch.Tensor] = None  # [R, S] bool: slots holding each row's committed K/V
        self.kv_len: list[int] = []  # per running row: valid slots (host copy of valid.sum(1))

    def prefill(self) -> None:
        width = max(len(t) for t in self.tokens)
        pad = self.target.info.pad_id
        ids = torch.tensor([[pad] * (width - len(t)) + t for t in self.tokens], dtype=torch.long, device=self.device)
        lengths = torch.tensor([len(t) for t in self.tokens], device=self.device)
        valid = torch.arange(width, device=self.device)[None, :] >= (width - lengths)[:, None]  # [B, Lp] left pads False
        positions = (valid.long().cumsum(dim=1) - 1).clamp_min(0)  # [B, Lp]; pads get 0 (masked anyway)
        logits, hidden = self.target.forward(ids, valid, positions, self.cache, last_only=True)
        self.target_forwards += 1
        first = next_tokens(logits[:, -1], self.params, self.generator).tolist()  # host sync: first tokens
        self.valid, self.kv_len = valid, [len(t) for t in self.tokens]
        if hidden is not None:
            self.pending = (hidden, valid, positions)
        if self.head is not None:  # BlockPilot-style: the prefill picks each row's plan
            from dllm.drafters.dflash.block_head import prompt_features

            self.plans = head_row_plans(self.head.pick(prompt_features(hidden, valid)), self.head, self.head_trees)
        for r, j in enumerate(self.active):
            self._commit(j, [first[r]])
        self._drop_finished()

    def round(self) -> None:
        """One draft-then-verify round over the running rows (a chain is the width-1 tree)."""
        k, lengths = self._widths()
        r_rows = len(self.active)
        anchor = torch.tensor([self.tokens[j][-1] for j in self.active], dtype=torch.long, device=self.device)
        anchor_pos = torch.tensor([len(self.tokens[j]) - 1 for j in self.active], dtype=torch.long,
                                  device=self.device)  # [R]
        draft = self._draft(anchor, anchor_pos, k, lengths) if k > 0 else Draft(
            tokens=torch.empty((r_rows, 0), dtype=torch.long, device=self.device), forwards=0)
        builder = self.plans.builder if k > 0 else None
        if builder is None:  # the chain [anchor, d_1..d_K]: its ancestor mask is the causal order of its slots
            k = draft.tokens.shape[1]  # a draft of dynamic length may be narrower than K: forward what it has
            ids = torch.cat([anchor[:, None], draft.tokens], dim=1)  # [R, 1+K]
            positions = anchor_pos[:, None] + torch.arange(k + 1, device=self.device)  # [R, 1+K]
            mask = torch.cat([self.valid, torch.ones_like(ids, dtype=torch.bool)], dim=1)  # [R, S+1+K]
        else:
            from dllm.drafters.trees.verify import tree_inputs

            tree = builder.tree_for(torch.log_softmax(_draft_logits(draft, builder).float(), dim=-1),
                                    draft.paths)  # nodes [R, N]
            ids, positions, inner = tree_inputs(anchor, anchor_pos, tree)  # [R, 1+N] x2, [R, 1+N, 1+N]
            mask = torch.cat([self.valid[:, None, :].expand(r_rows, ids.shape[1], -1), inner],
                             dim=2)[:, None]  # [R, 1, 1+N, S+1+N]
        s = cache_length(self.cache)
        logits, hidden = self.target.forward(ids, mask, positions, self.cache)  # [R, 1+N, V]
        self.target_forwards += 1
        self.rounds += 1
        if builder is None:
            accepted, nxt = verify(draft.tokens, logits, self.params, q=draft.probs, generator=self.generator,
                                   lengths=_cap(draft.lengths, lengths))
            steps = torch.arange(1, k + 1, device=self.device)[None, :]  # [1, K]
            path = torch.where(steps <= accepted[:, None], steps, torch.zeros_like(steps))  # [R, K]
        else:
            from dllm.drafters.trees.verify import walk_tree

            path, accepted, nxt = walk_tree(logits, tree, self.params, k, self.generator)  # [R, K], [R], [R]
        self._accept(path, accepted, nxt, ids, hidden, anchor_pos, s)

    def _accept(self, path: torch.Tensor, accepted: torch.Tensor, nxt: torch.Tensor, ids: torch.Tensor,
                hidden: Optional[torch.Tensor], anchor_pos: torch.Tensor, s: int) -> None:
        """Commit each row's accepted path (``path`` [R, K]: node indices into ``[root, nodes]``, 0
        after the row's last) and its next token; keep the path's slots valid, the rest as holes."""
        r, t = ids.shape
        k = path.shape[1]
        path_tokens = ids.gather(1, path)  # [R, K] (the root's token after the path: never read)
        back = torch.cat([accepted[:, None], nxt[:, None], path_tokens, path], dim=1).tolist()  # host sync
        for row, j in enumerate(self.active):
            acc = back[row][0]
            self.acceptance[j].append(self._commit(j, back[row][2:2 + acc] + [back[row][1]]))
        advance = 1 + max(max(row[2 + k:], default=0) for row in back)  # past the deepest accepted slot
        crop_to(self.cache, s + advance)  # roll back what no row accepted
        new_valid = torch.zeros((r, t), dtype=torch.bool, device=self.device)
        new_valid.scatter_(1, path, path > 0)  # the path's nodes (its 0 entries write False onto the root)
        new_valid[:, 0] = True  # the root (the anchor) is always committed
        self.valid = torch.cat([self.valid, new_valid[:, :advance]], dim=1)
        self.kv_len = [n + row[0] + 1 for n, row in zip(self.kv_len, back)]
        if hidden is not None:  # the drafter's next features: root + accepted path, in path order
            most = max(row[0] for row in back)
            order = torch.cat([path.new_zeros((path.shape[0], 1)), path[:, :most]], dim=1)  # [R, 1+most]
            keep = torch.arange(most + 1, device=self.device)[None, :] <= accepted[:, None]
            gathered = hidden.gather(1, order[:, :, None].expand(-1, -1, hidden.shape[-1]))
            self.pending = (gathered, keep, anchor_pos[:, None] + torch.arange(most + 1, device=self.device))
        self._drop_finished()
        self._maybe_compact()

    def _select(self, keep: list[int]) -> None:
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        select_rows(self.cache, idx)
        self.valid = self.valid[idx]
        self.kv_len = [self.kv_len[r] for r in keep]
        if self.pending is not None:
            self.pending = tuple(t[idx] for t in self.pending)  # type: ignore[assignment]
        self.session.select(idx)

    def _maybe_compact(self) -> None:
        if not self.active:
            return
        s = self.valid.shape[1]
        common_holes = s - max(self.kv_len)  # columns that compaction would drop
        if common_holes > max(self.block, s // 4):
            self.valid = compact(self.cache, self.valid, max(self.kv_len))


def _cap(lengths: Optional[torch.Tensor], own: Optional[list[int]]) -> Optional[torch.Tensor]:
    """The drafter's per-row lengths capped by each row's own draft count (None: no cap)."""
    if own is None:
        return lengths
    cap = torch.tensor(own, dtype=torch.long, device=lengths.device if lengths is not None else None)
    return cap if lengths is None else torch.minimum(lengths, cap.to(lengths.device))


def _draft_logits(draft: Draft, builder) -> torch.Tensor:
    if draft.logits is None:  # a drafter that did not say so before the call (gives_distributions None)
        from dllm.drafters.trees.builders import tokens_only

        raise ValueError(tokens_only(builder.spec))
    return draft.logits


def _block_head(head: Any, drafter) -> Optional["BlockHead"]:
    """The block head of a plan: the drafter's for ``"auto"``, or the given ``BlockHead``; None for
    no head. Clear errors for a drafter without a head, or one it cannot read."""
    if head is None:
        return None
    if isinstance(head, str):  # "auto" (as_plan refused any other string)
        head = getattr(drafter, "block_head", None)
        if head is None:
            raise ValueError(f"plan 'auto' needs a drafter with a block head (a DFlash checkpoint with "
                             f"block_head.json, e.g. dflash:model=tiny-ar-dflash-wide); the {drafter.name!r} "
                             f"drafter has none: pass an int block size as the plan (plan=16)")
    if not drafter.target_layers:
        raise ValueError(f"a block head reads the target's tapped prefill states; the {drafter.name!r} drafter "
                         f"taps no target layers")
    return head


__all__ = ["speculative_generate"]
