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
Batch size 1 has no holes at all. With per-row block sizes (``block_size="auto"``, a block head
picking each row's B after the prefill) a round forwards the largest B of its running rows and
verifies each row's own ``B - 1`` drafts (``verify``'s per-row lengths), so a row alone runs its own B.

Host syncs (ours): one per round, on purpose: the accepted counts, the draft and the next tokens
come back together (``tolist``) because the per-row bookkeeping (stops, stop strings, the crop
length, the next round's inputs) is host-side Python; the prefill reads the first tokens the same
way. Everything else the loop needs on the host (lengths, the compaction width) is kept there.
Not ours: transformers' mask construction may read the mask back, and a drafter may sync (``dlm``
runs ``dllm.generate``; ``ngram`` builds its draft from the host lists).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import torch

from dllm.drafters.base import Draft, DraftContext, DraftSetup, DrafterSpec, make_drafter
from dllm.drafters.output import SpeculativeOutput, pack_sequences
from dllm.drafters.prompts import Prompts, StopRule, encode_prompts, stop_strings
from dllm.drafters.target import Target, cache_length, compact, crop_to, select_rows
from dllm.drafters.verify import SamplingParams, next_tokens, verify
from dllm.options import check_bool, check_int

if TYPE_CHECKING:
    from dllm.drafters.block_head import BlockHead


def speculative_generate(
    target,
    drafter: DrafterSpec,
    prompts: Prompts,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    block_size: Union[int, str, "BlockHead", None] = None,
    stop: Union[str, Sequence[str], None] = None,
    seed: Optional[int] = None,
    eos_token_id: Union[int, Sequence[int], None] = None,
    tokenizer: Any = None,
    return_stats: bool = True,
    tree: Any = None,
) -> Union[SpeculativeOutput, torch.Tensor]:
    """Generate up to ``max_new_tokens`` tokens per prompt with ``target``, drafted by ``drafter``.

    Args:
        target: a transformers causal LM (``AutoModelForCausalLM``; Qwen3, Qwen2, Llama, ...) whose
            cache is a croppable ``DynamicCache``.
        drafter: a registered drafter name, spec string (``"ngram:max_ngram=4"``), mapping or
            ``Drafter`` instance (``dllm.drafters.list_drafters()``).
        prompts: a string, a list of strings (need a tokenizer), a list of token-id lists (ragged),
            or a LongTensor [B, Lp] (rows taken as unpadded) / [Lp].
        max_new_tokens: most generated tokens per row (a stop token included).
        temperature, top_p, top_k: the target's sampling settings, applied as transformers does
            (temperature, then top-k, then top-p); temperature 0 is greedy.
        block_size: B, tokens per verification forward (the anchor and K = B - 1 drafts); default
            the drafter's. B = 1 is plain autoregressive decoding through the same loop. ``"auto"``:
            each row's B is picked after the prefill by the drafter's block head (``block_head.py``;
            a DFlash checkpoint with ``block_head.json``), or pass a ``BlockHead``; a round then
            forwards the largest B of its rows and verifies each row's own ``B - 1`` drafts. A head
            whose plans include draft trees also picks chain or tree; the call's rows share the one
            most of them picked (tree rounds use the round's largest B for every row).
        stop: stop string(s); a row ends with the token that completes one (needs a tokenizer).
        seed: seeds a private ``torch.Generator`` for every random draw (None: the global RNG).
        eos_token_id: id(s) that end a row (default None: the target's generation config, then its
            config; [] = none).
        tokenizer: for string prompts, stop strings and ``texts`` (default: ``target.tokenizer``).
        return_stats: True returns a ``SpeculativeOutput``; False only its ``sequences`` [B, Lp + G].
        tree: a registered tree builder (``"ddtree:budget=32"``, ``dllm.drafters.tree``): verify a
            draft tree built from the drafter's per-position distributions in one forward
            (``tree_verify.py``) instead of the drafted chain; None = the chain.
    """
    t_start = time.perf_counter()
    params = SamplingParams(temperature, top_k, top_p)
    check_int("max_new_tokens", max_new_tokens, 1)
    check_bool("return_stats", return_stats)
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    drafter_obj = make_drafter(drafter)
    from dllm.drafters.tree import make_tree_builder

    builder = None if tree is None else make_tree_builder(tree)
    tokenizer = tokenizer if tokenizer is not None else getattr(target, "tokenizer", None)
    tgt = Target(target, taps=drafter_obj.target_layers, eos_token_id=eos_token_id, tokenizer=tokenizer)
    head = _block_head(block_size, drafter_obj, builder)
    block = max(head.sizes) if head is not None else drafter_obj.block_size if block_size is None else block_size
    check_int("block_size", block, 1, hint=" (the anchor plus block_size - 1 drafts), or 'auto'")
    drafter_obj.check_target(tgt.info)
    rows = encode_prompts(prompts, tokenizer, tgt.info.vocab_size)
    head_trees = {}  # tree spec -> builder, for a head whose plans include trees
    for spec in [] if head is None else head.tree_specs:
        head_trees[spec] = make_tree_builder(spec)
    for b in [builder, *head_trees.values()]:
        if b is not None:
            _check_tree_room(b, target, max(len(r) for r in rows) + max_new_tokens)
            b.check_drafter(drafter_obj)
    stops = StopRule(frozenset(tgt.info.eos_ids), max_new_tokens, stop_strings(stop, tokenizer), tokenizer)
    generator = None if seed is None else torch.Generator(device=tgt.device).manual_seed(seed)
    setup = DraftSetup(target=target, info=tgt.info, block_size=block, batch_size=len(rows), params=params,
                       generator=generator, device=tgt.device)
    run = _Run(tgt, drafter_obj.begin(setup), rows, block, params, generator, stops)
    run.tree, run.head, run.head_trees = builder, head, head_trees
    with torch.inference_mode():
        run.prefill()
        while run.active:
            run.round()
    sequences, lp = pack_sequences(rows, run.generated, tgt.info.pad_id)
    if not return_stats:
        return sequences
    texts = None
    if tokenizer is not None:
        texts = [tokenizer.decode(g, skip_special_tokens=True) for g in run.generated]
    return SpeculativeOutput(
        sequences=sequences, prompt_length=lp, generated=run.generated, texts=texts,
        stop_reasons=run.reasons, acceptance=run.acceptance, block_size=block, row_block_sizes=run.row_block,
        row_trees=run.row_tree,
        target_forwards=run.target_forwards, drafter_forwards=run.drafter_forwards, rounds=run.rounds,
        wall_time=time.perf_counter() - t_start,
    )


# ---- the loop ------------------------------------------------------------------------------------------
class _Run:
    """One call's state. Python lists per call row (tokens, stops, statistics); tensors for the R
    rows still running, in ``active`` order: the cache, its ``valid`` slot mask, pending features."""

    def __init__(self, target: Target, session, rows: list[list[int]], block: int, params: SamplingParams,
                 generator: Optional[torch.Generator], stops: StopRule) -> None:
        self.target, self.session, self.block, self.params = target, session, block, params
        self.generator, self.stops = generator, stops
        self.device = target.device
        self.tokens = [list(r) for r in rows]  # committed ids per call row
        self.generated: list[list[int]] = [[] for _ in rows]
        self.reasons = ["" for _ in rows]
        self.acceptance: list[list[int]] = [[] for _ in rows]
        self.active = list(range(len(rows)))  # call rows still running, in cache-row order
        self.cache = target.new_cache(len(rows))
        self.valid: Optional[torch.Tensor] = None  # [R, S] bool: slots holding each row's committed K/V
        self.kv_len: list[int] = []  # per running row: valid slots (host copy of valid.sum(1))
        self.pending: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None  # features since the last draft
        self.target_forwards = self.drafter_forwards = self.rounds = 0
        self.tree = None  # a TreeBuilder: verify trees (tree_verify.py) instead of chains
        self.head = None  # a BlockHead: per-row plans (block size, tree or chain), chosen after the prefill
        self.head_trees: dict = {}  # the head's tree specs -> their builders
        self.row_block: Optional[list[int]] = None  # per call row, with a head
        self.row_tree: Optional[list[Optional[str]]] = None  # per call row, the picked plan's tree (None: chain)

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
        if self.head is not None:  # BlockPilot-style: the prefill picks each row's block size
            from dllm.drafters.block_head import prompt_features

            picks = self.head.pick(prompt_features(hidden, valid))
            self.row_block = [self.head.sizes[i] for i in picks]
            self.row_tree = [self.head.trees[i] for i in picks]
            spec = shared_tree(picks, self.head.trees)
            self.tree = None if spec is None else self.head_trees[spec]
        for r, j in enumerate(self.active):
            self._commit(j, [first[r]])
        self._drop_finished()

    def round(self) -> None:
        block = self.block if self.row_block is None else max(self.row_block[j] for j in self.active)
        r_rows, k = len(self.active), block - 1
        anchor = torch.tensor([self.tokens[j][-1] for j in self.active], dtype=torch.long, device=self.device)
        anchor_pos = torch.tensor([len(self.tokens[j]) - 1 for j in self.active], dtype=torch.long,
                                  device=self.device)  # [R]
        draft = self._draft(anchor, anchor_pos, k) if k > 0 else Draft(
            tokens=torch.empty((r_rows, 0), dtype=torch.long, device=self.device), forwards=0)
        if self.tree is not None and k > 0:
            return self._tree_round(anchor, anchor_pos, draft, k)
        ids = torch.cat([anchor[:, None], draft.tokens], dim=1)  # [R, B]
        positions = anchor_pos[:, None] + torch.arange(block, device=self.device)  # [R, B]
        mask = torch.cat([self.valid, torch.ones_like(ids, dtype=torch.bool)], dim=1)  # [R, S + B]
        s = cache_length(self.cache)
        logits, hidden = self.target.forward(ids, mask, positions, self.cache)  # [R, B, V]
        self.target_forwards += 1
        self.rounds += 1
        accepted, nxt = verify(draft.tokens, logits, self.params, q=draft.probs, generator=self.generator,
                               lengths=self._draft_lengths(draft, k))
        # host sync (one per round): accepted counts, next tokens and drafts together
        back = torch.cat([accepted[:, None], nxt[:, None], draft.tokens], dim=1).tolist()
        for r, j in enumerate(self.active):
            acc = back[r][0]
            emitted = self._commit(j, back[r][2:2 + acc] + [back[r][1]])
            self.acceptance[j].append(emitted)
        adv = [row[0] + 1 for row in back]  # slots with K/V per row: the anchor and the accepted drafts
        advance = max(adv)
        crop_to(self.cache, s + advance)  # roll back what no row accepted
        new_valid = torch.arange(advance, device=self.device)[None, :] < (accepted[:, None] + 1)  # [R, advance]
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self.kv_len = [n + a for n, a in zip(self.kv_len, adv)]
        if hidden is not None:
            self.pending = (hidden[:, :advance], new_valid, positions[:, :advance])
        self._drop_finished()
        self._maybe_compact()

    def _tree_round(self, anchor: torch.Tensor, anchor_pos: torch.Tensor, draft: Draft, k: int) -> None:
        """One round over a draft tree (``tree_verify.py``): root + N nodes in one forward, a walk,
        the accepted path's slots kept valid, the other tree slots left as holes."""
        from dllm.drafters.tree_verify import tree_inputs, walk_tree

        if draft.logits is None:
            raise ValueError(f"tree builder {self.tree.spec!r} builds trees from the drafter's per-position "
                             f"distributions, but this drafter returns tokens only (Draft.logits is None); "
                             f"use a drafter that gives them (dflash) or no tree")
        tree = self.tree.tree_for(torch.log_softmax(draft.logits.float(), dim=-1), draft.paths)  # nodes [R, N]
        ids, positions, inner = tree_inputs(anchor, anchor_pos, tree)  # [R, 1+N], [R, 1+N], [R, 1+N, 1+N]
        r, t = ids.shape
        mask = torch.cat([self.valid[:, None, :].expand(r, t, -1), inner], dim=2)[:, None]  # [R, 1, 1+N, S+1+N]
        s = cache_length(self.cache)
        logits, hidden = self.target.forward(ids, mask, positions, self.cache)  # [R, 1+N, V]
        self.target_forwards += 1
        self.rounds += 1
        path, accepted, nxt = walk_tree(logits, tree, self.params, k, self.generator)  # [R, K], [R], [R]
        path_tokens = ids.gather(1, path)  # [R, K] (the root's token after the path: never read)
        back = torch.cat([accepted[:, None], nxt[:, None], path_tokens, path], dim=1).tolist()  # host sync
        for row, j in enumerate(self.active):
            acc = back[row][0]
            self.acceptance[j].append(self._commit(j, back[row][2:2 + acc] + [back[row][1]]))
        advance = 1 + max(max(row[2 + k:]) for row in back)  # past the deepest accepted slot of any row
        crop_to(self.cache, s + advance)
        new_valid = torch.zeros((r, t), dtype=torch.bool, device=self.device)
        new_valid.scatter_(1, path, path > 0)  # the path's nodes (its 0 entries write False onto the root)
        new_valid[:, 0] = True  # the root (the anchor) is always committed
        self.valid = torch.cat([self.valid, new_valid[:, :advance]], dim=1)
        self.kv_len = [n + row[0] + 1 for n, row in zip(self.kv_len, back)]
        if hidden is not None:  # the drafter's next features: root + accepted path, in path order
            most = max(row[0] for row in back)
            order = torch.cat([torch.zeros_like(path[:, :1]), path[:, :most]], dim=1)  # [R, 1+most]
            keep = torch.arange(most + 1, device=self.device)[None, :] <= accepted[:, None]
            gathered = hidden.gather(1, order[:, :, None].expand(-1, -1, hidden.shape[-1]))
            self.pending = (gathered, keep, anchor_pos[:, None] + torch.arange(most + 1, device=self.device))
        self._drop_finished()
        self._maybe_compact()

    def _draft(self, anchor: torch.Tensor, anchor_pos: torch.Tensor, k: int) -> Draft:
        hidden = mask = pos = None
        if self.pending is not None:
            hidden, mask, pos = self.pending
        ctx = DraftContext(
            tokens=[self.tokens[j] for j in self.active],
            rows=torch.tensor(self.active, dtype=torch.long, device=self.device), anchor=anchor,
            anchor_position=anchor_pos, num_draft=k, round=self.rounds, params=self.params,
            generator=self.generator, hidden=hidden, hidden_mask=mask, hidden_positions=pos,
        )
        draft = self.session.propose(ctx)
        _check_draft(draft, len(self.active), k, self.target.info.vocab_size)
        draft.tokens = draft.tokens.to(self.device)  # a drafter on another device: no-op otherwise
        draft.probs = None if draft.probs is None else draft.probs.to(self.device)
        draft.lengths = None if draft.lengths is None else draft.lengths.to(self.device)
        self.drafter_forwards += int(draft.forwards)
        return draft

    def _draft_lengths(self, draft: Draft, k: int) -> Optional[torch.Tensor]:
        """Drafts each row may have accepted: the drafter's lengths, capped by the row's own block size
        when rows of one round chose different sizes (the round forwards the largest)."""
        if self.row_block is None:
            return draft.lengths
        cap = [self.row_block[j] - 1 for j in self.active]
        if min(cap) == k:
            return draft.lengths
        cap_t = torch.tensor(cap, dtype=torch.long, device=self.device)  # [R]
        return cap_t if draft.lengths is None else torch.minimum(draft.lengths, cap_t)

    def _commit(self, j: int, new: list[int]) -> int:
        emitted, reason = self.stops.extend(self.generated[j], new)
        self.tokens[j].extend(self.generated[j][len(self.generated[j]) - emitted:])
        if reason is not None:
            self.reasons[j] = reason
        return emitted

    def _drop_finished(self) -> None:
        keep = [r for r, j in enumerate(self.active) if not self.reasons[j]]
        if len(keep) == len(self.active):
            return
        self.active = [self.active[r] for r in keep]
        if not keep:
            return
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


def shared_tree(picks: Sequence[int], trees: Sequence[Optional[str]]) -> Optional[str]:
    """The tree setting a call's rows share (a round is a tree round or a chain round for every row):
    the one most rows picked, ties to the plan listed first."""
    counts: dict[Optional[str], int] = {}
    for i in picks:
        counts[trees[i]] = counts.get(trees[i], 0) + 1
    first = {t: min(i for i in picks if trees[i] == t) for t in counts}
    return max(counts, key=lambda t: (counts[t], -first[t]))


def _block_head(block_size: Any, drafter, tree) -> Optional["BlockHead"]:
    """The block head of ``block_size="auto"`` (the drafter's) or a given ``BlockHead``; None for an
    int or None. Clear errors for a drafter without a head, or one it cannot read."""
    from dllm.drafters.block_head import BlockHead

    if isinstance(block_size, BlockHead):
        head = block_size
    elif isinstance(block_size, str):
        if block_size != "auto":
            raise ValueError(f"block_size must be a positive int, 'auto' or a BlockHead, got {block_size!r}")
        head = getattr(drafter, "block_head", None)
        if head is None:
            raise ValueError(f"block_size='auto' needs a drafter with a block head (a DFlash checkpoint with "
                             f"block_head.json, e.g. dflash:model=tiny-ar-dflash-wide); the {drafter.name!r} "
                             f"drafter has none: pass an int block_size")
    else:  # None or an int (checked by the caller)
        return None
    if not drafter.target_layers:
        raise ValueError(f"a block head reads the target's tapped prefill states; the {drafter.name!r} drafter "
                         f"taps no target layers")
    if tree is not None:
        raise ValueError("block_size='auto' (a block head) does not combine with a draft tree: a tree's budget "
                         "already sets the verified tokens; pass an int block_size with tree=")
    return head


def _check_tree_room(builder, target, longest: int) -> None:
    """A round holds the committed slots plus 1 + budget tree slots; refuse more than the target's
    ``max_position_embeddings`` (the size a static cache of the model would have)."""
    config = getattr(target, "config", None)
    limit = getattr(config.get_text_config() if hasattr(config, "get_text_config") else config,
                    "max_position_embeddings", None)
    budget = builder.config.budget
    if isinstance(limit, int) and longest + 1 + budget > limit:
        raise ValueError(f"a tree of {budget} nodes on top of {longest} tokens (the longest prompt + "
                         f"max_new_tokens) needs {longest + 1 + budget} cache slots, more than the target's "
                         f"max_position_embeddings {limit}; use a smaller budget or fewer tokens")


def _check_draft(draft: Draft, rows: int, k: int, vocab: int) -> None:
    """A drafter's output has the promised shapes (a broken drafter fails here, not in the target)."""
    t = draft.tokens
    if not isinstance(t, torch.Tensor) or t.shape != (rows, k) or t.dtype != torch.long:
        got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"the drafter returned tokens {got}; expected long [{rows}, {k}] (rows, block_size - 1)")
    if draft.probs is not None and draft.probs.shape != (rows, k, vocab):
        raise ValueError(f"the drafter returned probs {list(draft.probs.shape)}; expected [{rows}, {k}, {vocab}] "
                         f"(rows, block_size - 1, the target's vocabulary) or None")
    if draft.lengths is not None and draft.lengths.shape != (rows,):
        raise ValueError(f"the drafter returned lengths {list(draft.lengths.shape)}; expected [{rows}] or None")


__all__ = ["Prompts", "StopRule", "encode_prompts", "speculative_generate"]
