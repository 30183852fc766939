"""The decode loop: blocks -> steps -> forward -> sampler -> commit.

``generate`` is the one engine behind every sampler and every cache policy:

    x = [left-padded prompt | MASK * G]
    kv = cache.allocate(...)                   # K/V buffers, once per call (None for "none")
    for each block [s, e):
        sampler.begin_block(state)
        while the block has masks (adaptive; refining: or a row not settled) / for each budgeted step (fixed):
            q = cache.query(state, step)         # full forward, or a query slice against the cache
            logits = forward(x[:, q.start:q.end], kv view, soft inputs of the block if the sampler set them)
            decision = sampler.step(StepInput, state)
            commit (progress guaranteed), rewrites (refining samplers), trace, callback
        stop rows whose answer ended (once per block, ``stop_at_eos``)

Batches are left-padded with explicit positions and a key-padding mask, so a prompt decodes to the
same tokens alone or in a batch (float32; except under the ``drift`` cache, whose recomputed columns
are chosen for the whole batch: ``dllm.cache.drift``).
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence, Union

import torch

from dllm.cache.base import CachePolicy, CacheSpec
from dllm.cache.block_causal import block_size_of
from dllm.engine.graphs import GRAPHS_KEY, GraphsOption, StepGraphs, check_graphs_option
from dllm.inputs import Prompts, check_call, encode_prompts, fit_layers, init_state, model_device
from dllm.outputs import ended_unread, finish_output, stop_finished_rows
from dllm.engine.forwards import StepForwards
from dllm.engine.progress import guarantee_progress
from dllm.rows import held_mask
from dllm.samplers import Sampler
from dllm.samplers.draws import make_generator, per_row
from dllm.options import check_bool
from dllm.schedule import BLOCK_SIZE_KEY, LOGIT_SHIFT_KEY
from dllm.settings import DecodeSettings, default_gen_length
from dllm.state import BlockViews, DecodeState, GenerationOutput, StepCallback, StepInput, StepOutput


def generate(
    model,
    prompts: Prompts,
    sampler: Union[str, Sampler] = "low_confidence",
    *,
    gen_length: Optional[int] = None,
    block_length: Optional[int] = None,
    steps: Optional[int] = None,
    temperature: float = 0.0,
    cfg_scale: float = 0.0,
    seed: Union[int, Sequence[Optional[int]], None] = None,
    chat: bool = False,
    stop_at_eos: bool = False,
    cache: CacheSpec = "none",
    return_trace: bool = False,
    callback: Optional[StepCallback] = None,
    cuda_graphs: GraphsOption = False,
    skip_released: bool = True,
    **sampler_options: Any,
) -> GenerationOutput:
    """Decode ``gen_length`` tokens after each prompt with a registered sampler.

    Args:
        model: a ``dllm.models.DiffusionLM`` (``logits[:, i]`` predicts position i).
        prompts: a string, a list of strings, a list of token-id lists, or a LongTensor [B, Lp]
            (rows taken as unpadded) / [Lp]. Strings need the model's tokenizer.
        sampler: a registered name (``dllm.list_samplers()``) or a ``Sampler`` instance.
        gen_length: generated positions per row (G). None: the model's default
            (``dllm.settings.default_gen_length``: a task model's answer length for task prompts, as
            it was trained; else 128).
        block_length: semi-autoregressive block length (default G: one block). The last block may
            be shorter.
        steps: total sampler steps for fixed-step samplers, split evenly over blocks (a multiple of
            the number of blocks, at most ``block_length`` per block; default G: one token per
            step). A last partial block gets ``min(steps per block, its length)`` steps.
        temperature: 0 = greedy proposals; > 0 samples (how: the sampler's docstring).
        cfg_scale: classifier-free guidance as in LLaDA (``un + (s + 1)(cond - un)``, the
            unconditional branch has the prompt masked); one forward on the doubled batch.
        seed: seeds a private ``torch.Generator`` used for every random draw (None: the global one);
            an integer in [0, 2**64 - 1], the generator's range (a larger one is refused, not reduced).
            A list gives one seed per prompt: each row draws from its own generator exactly what it
            draws alone with that seed (``dllm.samplers.draws``; None in the list: a fresh seed).
        chat: apply the model's chat template to string prompts (its tokenizer's, else the family's
            default; a model whose vocabulary lacks the template's tokens is refused, naming it).
        stop_at_eos: after each block, rows that produced EOS/EoT are finished (their remaining
            positions become EOS); generation stops when every row is finished.
        cache: KV-cache policy (``dllm.cache``): ``"none"`` recomputes the whole canvas every step;
            ``"prefix"``, ``"dual"``, ``"window"`` reuse keys/values between full forwards. Options
            go with the name as a spec string (``"dual:refresh=4"``), a mapping
            (``{"name": "dual", "refresh": 4}``) or a policy instance (``DualCache(refresh=4)``).
        return_trace: also return, per generated position, the step at which it was committed.
        callback: called with the ``DecodeState`` after every step (live views).
        cuda_graphs: False (eager); True: every cached forward is captured once per shape as a CUDA
            graph and replayed (``dllm.engine.graphs``; a CUDA model; the same tokens as eager); "static": the
            same static step run eagerly, on any device; "check": "static" with every replay checked against
            the capture (``dllm.engine.graph_check``: the operators, external memory and scalars a graph
            would replay; ``GraphReplayError`` where they differ).
        skip_released: True: once a row is released (``dllm.rows``: its answer ended under
            ``stop_at_eos``, or ``release_rows`` in a callback) later forwards compute only the held
            rows; False: every row is forwarded to the end (the reference path; the same tokens).
        **sampler_options: the sampler's Config fields (unknown names list the valid ones). An option
            given both here and in a ``sampler`` spec string or mapping is refused (no silent winner).
        ``chat``, ``stop_at_eos``, ``return_trace`` and ``skip_released`` are True or False only (a
        string such as ``"no"`` is refused, never read as true).
    """
    t_start = time.perf_counter()
    check_call(model, callback)
    for name, flag in (("chat", chat), ("stop_at_eos", stop_at_eos), ("return_trace", return_trace),
                       ("skip_released", skip_released)):
        check_bool(name, flag)
    settings = DecodeSettings.of(sampler=sampler, cache=cache, block_length=block_length, steps=steps,
                                 temperature=temperature, cfg_scale=cfg_scale, seed=seed, options=sampler_options)
    rows = encode_prompts(model, prompts, chat=chat)
    if gen_length is None:
        gen_length = default_gen_length(model, rows)
    resolved = settings.resolve(model, rows, gen_length)  # every check; SettingError names the field
    sampler_obj, policy, plan = resolved.sampler, resolved.policy, resolved.plan

    device = model_device(model)
    prepared = time.perf_counter()
    sampler_obj.prepare(device)  # a sampler's own model (APD's verifier) loads outside the wall time
    t_start += time.perf_counter() - prepared
    if cuda_graphs is True and getattr(model, "sharding", None) is not None:  # collectives inside a capture
        raise ValueError("cuda_graphs=True on a model split over ranks (tensor_parallel) is not supported yet; "
                         "use cuda_graphs='static' or False")
    cuda_graphs = check_graphs_option(cuda_graphs, device)
    generator = make_generator(seed, rows, device)
    state = init_state(model, rows, gen_length, temperature, generator, device)
    state.extras["eos_ids"] = tuple(getattr(model, "eos_ids", ()) or ())
    if block_size_of(model) is not None:
        state.extras[BLOCK_SIZE_KEY] = block_size_of(model)
    state.block_length = plan.block_length
    forward_rows = state.batch_size * (2 if cfg_scale > 0 else 1)  # CFG doubles the forward batch
    state.kv = policy.allocate(model, forward_rows, state.x.shape[1])
    if state.kv is not None:  # a column's position is fixed for the call: the forwards need not record it
        state.kv.fix_positions(state.positions.repeat(2, 1) if cfg_scale > 0 else state.positions)
    shift = int(getattr(model, "logit_shift", 0))  # Dream: a query predicting s starts at s - 1
    state.extras[LOGIT_SHIFT_KEY] = shift
    need_attn = fit_layers(sampler_obj.attention_layers, model)

    lp = state.prompt_length
    decode = Decode(model, sampler_obj, policy, state, cfg_scale=cfg_scale, shift=shift,
                    attn_layers=need_attn, callback=callback, skip_released=skip_released)
    if cuda_graphs is not False and state.kv is not None:
        decode.graphs = state.extras[GRAPHS_KEY] = StepGraphs(model, state.kv, cuda_graphs)
    with torch.inference_mode():
        for b, (s, e, block_steps) in enumerate(plan.blocks):
            decode.run_block(b, s + lp, e + lp, block_steps)  # canvas columns
            if stop_at_eos and b + 1 < len(plan.blocks) and stop_finished_rows(state):  # after the last: nothing left
                break

    wall = time.perf_counter() - t_start
    return finish_output(model, state, wall, return_trace)


class Decode(StepForwards):
    """One ``generate`` call's context: the model, the sampler, the cache policy, the state and the
    guidance settings. Its methods are the block loop; the three kinds of forwards (plain, with a
    shadow block, and verification variants) come from ``dllm.engine.forwards.StepForwards``."""

    def __init__(self, model, sampler: Sampler, policy: CachePolicy, state: DecodeState, *,
                 cfg_scale: float, shift: int, attn_layers: tuple[int, ...],
                 callback: Optional[StepCallback], skip_released: bool) -> None:
        self.model, self.sampler, self.policy, self.state = model, sampler, policy, state
        self.cfg_scale = cfg_scale  # > 0: classifier-free guidance on a doubled batch
        self.shift = shift  # the model's logit_shift (Dream: 1)
        self.attn_layers = attn_layers
        self.callback = callback
        self.skip_released = skip_released  # False: released rows are forwarded too (the reference path)
        self._carried: Optional[tuple[tuple[int, int], torch.Tensor]] = None  # ((block, step), next_logits)
        self.graphs: Optional[StepGraphs] = None  # cached forwards captured per shape (cuda_graphs)
        self.views = BlockViews(state)  # the canvas' views (and the block's cache views), once per block
        self._masks: Optional[torch.Tensor] = None  # [B, W] the block's masks, taken since the last write
        self._soft: Optional[tuple[int, Any]] = None  # (block start column, SoftInputs [B, W]) of the block's
        #   next forwards (StepOutput.soft), None: token inputs
        self._unsettled: Optional[torch.Tensor] = None  # [B] bool: rows a refining sampler has not settled
        self._wrote_beyond = False  # a step committed past its block (StepOutput.beyond): first tests read
        self._read_next: Optional[torch.Tensor] = None  # [K] the last step's StepOutput.read_next, unread
        self._host_read: Optional[list[int]] = None  # its values, for the next step (StepInput.host_read)
        self._live: Optional[tuple[bool, ...]] = None  # per-row seeds: the rows that draw at the next step
        self._max_steps = 0  # the current block's most steps

    # ---- the block loop -------------------------------------------------------------------------
    def run_block(self, b: int, s: int, e: int, block_steps: Optional[int]) -> None:
        """Decode canvas columns ``[s, e)``: ``block_steps`` steps (fixed-step samplers) or until the
        block has no masks (adaptive samplers, at most ``sampler.max_block_steps``)."""
        state, sampler = self.state, self.sampler
        state.block_index, state.block_start, state.block_end = b, s, e
        state.block_steps = block_steps
        state.block_step = 0
        self.views.clear()  # the last block's views
        block = self.views.get("x", s, e)  # [B, W]
        self._masks = block == state.mask_id  # [B, W] the block's masks now (the next step's, until a write)
        self._soft = self._unsettled = None
        self._read_next = self._host_read = self._live = None  # a block's first step gets nothing read for it
        state.block_masks_at_start = self._masks.sum(dim=1) if sampler.reads_block_masks else None  # [B]
        sampler.begin_block(state)
        refines = sampler.refines  # steps past the masks: bounded by the nominal block
        max_steps = block_steps if block_steps is not None else sampler.max_block_steps(
            max(e - s, state.block_length) if refines else e - s)
        self._max_steps = max_steps
        for i in range(max_steps):
            if block_steps is None:
                if i:
                    self._masks = block == state.mask_id
                if not i:  # the first test: known without a read unless a step wrote past its block
                    if not self._block_has_masks(s, e):
                        return
                else:
                    left = self._masks if self._unsettled is None else self._masks | self._unsettled[:, None]
                    if not self._block_left(left):  # one host sync per adaptive step: the loop condition
                        return
            state.block_step = i
            if self._step(i, s, e, block_steps) and block_steps is None:  # its commits filled the block, which
                ended_unread(state).append((s, e))  # its sampler knew: no test (checked in the call's one read)
                return
        if block_steps is None and bool((block == state.mask_id).any()):  # only after a block's every step:
            raise RuntimeError(  # with the skipped first test, still <= 1 read per step
                f"block [{s}, {e}) still has masks after {max_steps} steps; sampler {sampler!r} broke progress"
            )

    def _block_left(self, left: torch.Tensor) -> bool:
        """Whether ``left`` [B, W] (the block's masks, or unsettled rows) has a True: the adaptive loop's
        test, its one host read per step. The last step's ``read_next`` is read with it (one read for
        both) and kept for the next step (``StepInput.host_read``); with per-row seeds the rows' counts
        are read, and a row with none left draws nothing at the next step (``_live``: alone, it stops)."""
        extra, self._read_next = self._read_next, None
        rows = per_row(self.state.generator)
        if extra is None and not rows:
            return bool(left.any())
        counts = left.sum(dim=1)  # [B] long: its rows' counts, in one tensor with the sampler's
        if extra is not None:
            counts = torch.cat((counts, extra if extra.dtype == counts.dtype else extra.to(counts.dtype)))
        host, b = counts.tolist(), left.shape[0]
        self._host_read = host[b:] if extra is not None else None
        self._live = tuple(c > 0 for c in host[:b]) if rows else None
        return any(host[:b])

    def _block_has_masks(self, s: int, e: int) -> bool:
        """Whether the block at canvas columns ``[s, e)`` has a mask to decode at its start, read only
        when it must be. Blocks do not overlap (``dllm.schedule.plan_blocks``) and a step writes its
        own block only (commits, re-masks, rewrites), so until a step commits past its block
        (``StepOutput.beyond``, Prophet's all-in) every later block holds its masks in the held rows:
        no read while some row is held."""
        state = self.state
        if not self._wrote_beyond and len(state.released) < state.batch_size:
            return True
        return bool((state.x[:, s:e] == state.mask_id).any())  # the one read of this block's first test

    def _step(self, i: int, s: int, e: int, block_steps: Optional[int]) -> bool:
        """One step of the block at canvas columns ``[s, e)``; returns whether it ended the block, known on
        the host (``StepOutput.fills_block``)."""
        state, sampler = self.state, self.sampler
        shadow, attn = None, {}
        carried, self._carried = self._carried, None
        if carried is not None and carried[0] == (state.block_index, i - 1):
            logits, q0 = carried[1], s  # [B, W, V] this canvas, forwarded by the last step's variants
        else:
            query = self.policy.query(state, i, self.shift)
            if sampler.shadow_block:
                logits, shadow = self.shadow_forward(query, s, e)
                q0 = query.start
            elif sampler.reads_block_only:  # the step's view is the block: logits of its columns only
                logits, attn = self.forward(query, rows=(s - query.start, e - query.start))  # [B, W, V]
                q0 = s
            else:
                logits, attn = self.forward(query)
                q0 = query.start
        self._view_start = q0
        q_len = logits.shape[1]
        tokens = self.views.get("x", q0, q0 + q_len)  # [B, Q]
        masks, self._masks = self._masks, None  # the block's masks taken since the last write, if any
        if masks is not None and q0 == s and q_len == e - s:  # the view is the block: they are active
            active = masks
        else:
            active = tokens == state.mask_id  # [B, Q]
            a0 = max(s - q0, 0)  # a query may start inside the block (cache 'subblock': no masks left of it)
            if a0 > 0 or e - q0 < q_len:  # the view reaches past the block: its masks only
                active &= self.views.in_window(q_len, a0, e - q0)
        inp = StepInput(
            logits=logits, tokens=tokens, active=active, query_start=q0, window=(s - q0, e - q0),
            step=i, steps=block_steps, mask_id=state.mask_id, temperature=state.temperature,
            generator=state.generator if self._live is None else state.generator.only(self._live), attn=attn,
            forward_variants=self.variant_forward if sampler.needs_variants else None,
            shadow_logits=shadow, host_read=self._host_read,
            reads_next=block_steps is None and i + 1 < self._max_steps,  # a test of the block follows
        )
        self._host_read = None
        decision = sampler.step(inp, state)
        if decision.read_next is not None and inp.reads_next:  # read with the next step's loop test
            r = decision.read_next
            if r.dim() != 1 or r.dtype.is_floating_point or r.dtype.is_complex or r.device != state.x.device:
                raise RuntimeError(f"sampler {sampler.name!r} returned read_next {tuple(r.shape)} {r.dtype} on "
                                   f"{r.device}; it must be a 1-D integer tensor on the canvas' device "
                                   f"{state.x.device}")
            self._read_next = r
        if decision.fills_block:
            self._check_fills_block(decision)
        commit = guarantee_progress(decision, active, last=(block_steps is not None and i == block_steps - 1),
                                     adaptive=block_steps is None and not sampler.commits_every_step)
        if decision.beyond is not None:  # all-in: masks right of the block, never the prompt
            self._wrote_beyond = True
            later = self.views.in_window(q_len, e - q0, q_len)  # [1, Q] the columns right of the block
            commit = commit | (decision.beyond & later & (tokens == state.mask_id))
        self.views.write(commit, decision.tokens, state.step, q0)
        if decision.next_logits is not None and sampler.reads_block_only:  # a full view forwards anew
            if decision.remask is not None or decision.beyond is not None:
                raise RuntimeError(f"sampler {sampler.name!r} returned next_logits with remask or beyond, "
                                   f"which change the canvas they were computed for")
            self._carried = ((state.block_index, i), decision.next_logits)
        if decision.remask is not None:
            if not sampler.revises:
                raise RuntimeError(f"sampler {sampler.name!r} returned remask but does not declare "
                                   f"revises = True")
            remask = self._earlier_commits(decision.remask, tokens, commit, s, e, q0)  # [B, Q]
            self.views.write(remask, state.mask_id, -1, q0)  # trace -1: uncommitted
        if (decision.rewrite is not None or decision.settled is not None or decision.soft is not None
                or self._soft is not None):
            self._refine(decision, commit, tokens, s, e, q0)
        state.step += 1
        if self.callback is not None:
            self.callback(state)
        return decision.fills_block

    def _check_fills_block(self, decision: StepOutput) -> None:
        """A step's ``fills_block`` ends its block without a read: its commits hold the step's active
        masks, which are every mask of the block (a view starting inside the block has none left of it),
        so it must change nothing else; a sampler that says so otherwise breaks the contract."""
        if self.sampler.refines or any(x is not None for x in (decision.remask, decision.beyond, decision.rewrite,
                                                               decision.settled, decision.soft)):
            raise RuntimeError(f"sampler {self.sampler.name!r} returned fills_block with remask, beyond, rewrite, "
                               f"settled or soft inputs, or while it refines (its block ends once its rows are "
                               f"settled too); it means the step's commits alone end the block")

    def _earlier_commits(self, wanted: torch.Tensor, tokens: torch.Tensor, commit: torch.Tensor, s: int, e: int,
                         q0: int) -> torch.Tensor:
        """The positions of ``wanted`` [B, Q] a step may revise (re-mask or rewrite): tokens of the block
        committed before this step (not by it: bool > bool is a & ~b), in held rows only. ``tokens``
        is the canvas view after the step's commit, from column q0; the block is columns [s, e)."""
        q_len = tokens.shape[1]
        out = wanted & ((tokens != self.state.mask_id) > commit)  # [B, Q]
        if (s - q0, e - q0) != (0, q_len):  # the view reaches past the block
            out &= self.views.in_window(q_len, s - q0, e - q0)
        held_now = held_mask(self.state)  # [B] or None: a released row is never revised
        if held_now is not None:
            out &= held_now[:, None]
        return out

    def _refine(self, decision: StepOutput, commit: torch.Tensor, tokens: torch.Tensor, s: int, e: int,
                q0: int) -> None:
        """A step's rewrites of committed tokens, settled rows and soft inputs (``StepOutput``)."""
        state, sampler = self.state, self.sampler
        if (decision.rewrite is not None or decision.settled is not None) and not sampler.refines:
            raise RuntimeError(f"sampler {sampler.name!r} returned rewrite or settled but does not declare "
                               f"refines = True")
        if decision.soft is not None and (sampler.shadow_block or sampler.needs_variants):
            raise RuntimeError(f"sampler {sampler.name!r} returned soft inputs, which its extra forwards "
                               f"(shadow block, variants) do not take")
        if decision.rewrite is not None:  # committed tokens of the block only, never a released row's
            keep = self._earlier_commits(decision.rewrite, tokens, commit, s, e, q0)  # [B, Q]
            torch.where(keep, decision.tokens, tokens, out=tokens)  # in place: tokens is the canvas view
        if decision.settled is not None:
            held_now = held_mask(state)
            self._unsettled = ~decision.settled if held_now is None else held_now & ~decision.settled
        if decision.soft is not None and decision.soft.width != e - s:
            raise RuntimeError(f"sampler {sampler.name!r} returned soft inputs {decision.soft.width} wide for "
                               f"a block of {e - s}")
        self._soft = None if decision.soft is None else (s, decision.soft)


__all__ = ["Decode", "generate"]
