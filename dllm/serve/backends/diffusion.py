"""Serving a diffusion model: every request is ``dllm.generate`` on its prompt alone.

Every mode runs on the one scheduler (``dllm.serve.backends.scheduling.scheduler``: one thread, each running
``generate`` call a greenlet, their forwards merged step by step, ``dllm.serve.backends.scheduling.batcher``);
the modes are its admission policies (``dllm.serve.backends.scheduling.policy``, ``mode=...``):

- ``continuous`` (default): up to ``max_running`` requests decode at once. Requests whose settings
  one canvas can serve (no cache or ``prefix`` / ``dual``, a sampler whose step reads no step index,
  greedy or seeded: ``dllm.engine.running``) join the running decode of their settings at its next step (answers of
  any length that commit the same count per step): one state, one sampler step and one commit per
  step for all of them (``dllm.serve.backends.scheduling.joined``; ``join=False`` turns it off). Other requests
  queued together with the same settings (seeds aside: each row draws from its own generator) and
  length start as one real ``generate`` call of at most ``max_group`` rows (under light load, one
  request); a request joins the running batch at its first forward and leaves after its last,
  whatever block or step the others are at, with its own length, stops, sampler, cache and seed. A
  row of a group that is done early (EOS, a stop string, a cancel) ends its request at once and is
  released from its group's call (``dllm.rows``): its group's later forwards skip it; the other rows
  are unchanged.
- ``static``: the classic baseline. Up to ``max_running`` queued requests with the same settings
  and length run as one ``generate`` batch; the next batch starts once the whole batch has ended (a
  row done early is released from it as in a continuous group).
- ``serial``: one request at a time.

Streaming: after every step the row's final left prefix (committed, never revised: the leftmost
run of committed positions, or for a sampler that re-masks or rewrites committed tokens of its block,
``Sampler.revises`` / ``Sampler.refines``, the positions left of its current block) becomes text
deltas (``dllm.serve.backends.stream.TextStream``). Once that prefix holds an EOS or a stop
string the answer is final and the row leaves at once (continuous/serial), with the text the whole
decode would give. ``step_events`` requests also get one ``Step`` event per denoising step.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from dllm.cache.block_causal import block_size_of
from dllm.engine import generate
from dllm.engine.running import group_of
from dllm.inputs import decode_answer, encode_prompts
from dllm.options import SettingError
from dllm.samplers import make_sampler
from dllm.rows import release_rows
from dllm.serve.backends.base import BadRequest
from dllm.serve.backends.defaults import refuse_defaults, request_param
from dllm.serve.backends.scheduling.batcher import BatchedModel, BatcherConfig
from dllm.serve.backends.jobs import Delta, Done, Failed, Job, JobRequest, Step
from dllm.serve.backends.scheduling.joined import JoinedDecode
from dllm.settings import DecodeSettings
from dllm.serve.backends.prompts import chat_ids, text_ids
from dllm.serve.backends.scheduling.policy import MODES, make_policy
from dllm.serve.backends.scheduling.scheduler import Scheduler, SchedulerConfig, max_tokens_limit as default_limit
from dllm.serve.backends.stream import TextStream
from dllm.serve.backends.tensor_parallel import Call, Mirror

MIRRORED_MODES = ("static", "serial")  # the modes a split model is served in (one generate call at a time)



class _Leave(Exception):
    """Raised from the step callback: the row is done (its answer is final) or was cancelled."""


@dataclass
class _Row:
    """One job's row in a decode (row ``r`` of the call's state): its text stream and step events."""

    job: Job
    r: int
    stream: TextStream
    revises: bool  # the sampler may change committed tokens of the current block (revises or refines)
    pieces: dict[int, str]
    nfe: int = 0
    forwarded: int = 0
    final: int = 0  # length of the final prefix sent through the stream
    first_delta: Optional[float] = None

    def observe(self, state, g: list[int], traces: Optional[list[list[int]]]) -> bool:
        """After a step: send the new final text (and the Step event); True when the answer is final.
        ``g``: this row's generated ids, ``traces``: every row's trace (read once per step for all rows,
        None when no row asked for step events)."""
        mask = state.mask_id
        self.nfe, self.forwarded = state.nfe, state.forwarded_tokens  # the call's (a static batch's: shared)
        self.observe_answer(g, mask, max(0, state.block_start - state.prompt_length) if self.revises else None)
        if self.job.request.step_events and traces is not None:
            self.emit_step(state.step - 1, state.block_index, state.nfe, g, traces[self.r], mask)
        return self.stream.ended is not None

    def emit_step(self, step: int, block: int, nfe: int, g: list[int], trace: list[int], mask: int) -> None:
        """The ``Step`` event of step ``step``: the answer ``g`` after it (None where ``mask``), the step
        that committed each position (``trace``, -1 while masked) and this step's commits."""
        tokens = tuple(None if t == mask else self._piece(t) for t in g)
        self.job.emit(Step(step=step, block=block, nfe=nfe, tokens=tokens, trace=tuple(trace),
                           committed=tuple(i for i, s in enumerate(trace) if s == step)))

    def observe_answer(self, g: list[int], mask: int, final: Optional[int] = None) -> bool:
        """Send the new final text of the answer ``g`` (its ids, ``mask`` where undecided): its prefix
        up to ``final``, default its first mask. True when the answer is final (EOS or a stop string)."""
        if final is None:
            final = next((i for i, t in enumerate(g) if t == mask), len(g))
        if final != self.final:  # decode only when the final prefix grew
            self.final = final
            self._send(g[:final], complete=False)
        return self.stream.ended is not None

    def _piece(self, t: int) -> str:
        if t not in self.pieces:
            self.pieces[t] = self.stream.decode([t])
        return self.pieces[t]

    def _send(self, prefix: list[int], complete: bool) -> None:
        text, ids = self.stream.update(prefix, complete=complete)
        if text:
            if self.first_delta is None:
                self.first_delta = time.perf_counter()
            self.job.emit(Delta(text, ids))

    def finish(self, generated: Optional[list[int]], max_tokens: int, started: float) -> None:
        """The decode ended (``generated``: the row's whole answer) or the answer became final early."""
        if generated is not None and self.stream.ended is None:
            self._send(generated, complete=True)
        elif self.stream.ended is not None and self.stream.text != self.stream.sent:
            self._send(self.stream.answer_ids, complete=True)
        s, job = self.stream, self.job
        reason = "stop" if s.ended is not None else "length"
        now = time.perf_counter()
        job.emit(Done(text=s.text, token_ids=tuple(s.answer_ids), finish_reason=reason,
                      prompt_tokens=len(job.request.prompt_ids), completion_tokens=len(s.answer_ids),
                      nfe=self.nfe, forwarded_tokens=self.forwarded, queue_s=started - job.submitted,
                      ttft_s=None if self.first_delta is None else self.first_delta - job.submitted,
                      wall_s=now - job.submitted))


class DiffusionBackend(Scheduler):
    """Serves one ``DiffusionLM`` (``dllm.load``) under the OpenAI-style API (``dllm.serve.http.app``)."""

    kind = "diffusion"

    def __init__(self, model, *, name: str, defaults: DecodeSettings = DecodeSettings(),
                 mode: str = "continuous", max_running: int = 32, max_queue: int = 256,
                 max_running_tokens: int = 1 << 20, max_tokens_limit: Optional[int] = None,
                 chat_template: Optional[str] = None, batcher: BatcherConfig = BatcherConfig(),
                 max_group: Optional[int] = None, mirror: Optional[Mirror] = None, join: bool = True) -> None:
        policy = make_policy(mode, max_group, max_running)  # refuses a bad mode or max_group
        if mirror is not None and mode not in MIRRORED_MODES:
            raise ValueError(f"a model split over ranks is served with --mode {' or '.join(MIRRORED_MODES)} (one "
                             f"generate call at a time, which the other ranks replay), not {mode!r}")
        self.mirror = mirror
        if not hasattr(model, "mask_id"):
            raise TypeError(f"DiffusionBackend serves a dllm DiffusionLM (dllm.load), got {type(model).__name__}")
        self.model, self.model_name, self.defaults, self.mode = model, name, defaults, mode
        self.tokenizer = getattr(model, "tokenizer", None)
        self.max_positions = getattr(model, "max_positions", None)
        self.chat_template = chat_template
        self.eos_ids = frozenset(getattr(model, "eos_ids", ()) or ())
        self.block_size = block_size_of(model)  # block-causal models (SDAR): the trained block, else None
        self.max_tokens_limit = default_limit(max_tokens_limit, self.max_positions)
        super().__init__(SchedulerConfig(max_running=max_running, max_queue=max_queue,
                                         max_running_tokens=max_running_tokens), policy, model, batcher)
        self.check_settings(defaults, gen_length=max(defaults.block_length or 1, defaults.steps or 1))
        self._pieces: dict[int, str] = {}
        self._tok_lock = threading.Lock()
        self._served = BatchedModel(model, self)  # what each group's generate sees: forwards go to the loop
        self.join = join  # continuous mode: requests join the running decode of their key where one can serve them
        self._joined: dict[tuple, JoinedDecode] = {}  # continuous mode: the running decode of each key
        self._groups: dict[tuple, Optional[tuple]] = {}  # (settings, length) -> its running decode's group_of
        self.start()

    def resolve_settings(self, *, max_tokens: int, sampler: Optional[str] = None, cache: Optional[str] = None,
                         block_length: Optional[int] = None, steps: Optional[int] = None,
                         temperature: Optional[float] = None, seed: Optional[int] = None,
                         options: Optional[dict] = None) -> DecodeSettings:
        """A request's settings: its own fields over the server's defaults. The default sampler's
        options apply only when the request keeps the default sampler; a default block length longer
        than the request's ``max_tokens`` becomes ``max_tokens`` (one block), as ``generate`` needs
        ``block_length <= gen_length``, and then a default ``steps`` above ``max_tokens`` becomes
        ``max_tokens`` (one token a step: no call has more steps than positions). A server default that
        ``generate`` refuses with the request's fields is refused here, naming the request field that
        meets it (``dllm.serve.backends.defaults.refuse_defaults``); the rest is unchecked (``check`` does that)."""
        given = {name: value for name, value in (("sampler", sampler), ("cache", cache), ("block_length", block_length),
                                                 ("steps", steps), ("temperature", temperature), ("seed", seed),
                                                 ("sampler_options", options or None)) if value is not None}
        settings = self._over_defaults(max_tokens, given)
        refuse_defaults(self, settings, max_tokens, given)
        return settings

    def _over_defaults(self, max_tokens: int, given: dict) -> DecodeSettings:
        """``resolve_settings``' settings from the request fields ``given`` (the ones it sent)."""
        d = self.defaults
        opts = dict(d.options) if "sampler" not in given else {}
        opts.update(given.get("sampler_options") or {})
        block_length, steps = given.get("block_length"), given.get("steps")
        short = isinstance(max_tokens, int) and max_tokens >= 1 and self.block_size is None  # a block-causal
        #   model's block is its checkpoint's
        if block_length is None and d.block_length is not None and short:
            block_length = min(d.block_length, max_tokens)
        one_block = short and (block_length if block_length is not None else d.block_length or max_tokens) >= max_tokens
        if steps is None and d.steps is not None and one_block and d.steps > max_tokens:
            steps = max_tokens
        pick = lambda name: given.get(name, getattr(d, name))  # noqa: E731
        return DecodeSettings(sampler=pick("sampler"), cache=pick("cache"),
                              block_length=block_length if block_length is not None else d.block_length,
                              steps=d.steps if steps is None else steps, temperature=pick("temperature"),
                              seed=pick("seed"), options=tuple(sorted(opts.items())))

    # ---- prompts ----
    def encode_prompt(self, prompt: Union[str, Sequence[int]]) -> tuple[int, ...]:
        return text_ids(lambda p: encode_prompts(self.model, [p])[0], prompt)

    def encode_chat(self, messages: Sequence[dict]) -> tuple[int, ...]:
        template = self.chat_template
        if template is None:
            try:
                template = self.model.usable_chat_template(
                    hint="send a raw prompt to /v1/completions, or start the server with --chat-template FILE")
            except ValueError as err:
                raise BadRequest("messages", str(err)) from None
        return chat_ids(self.tokenizer, template, messages, self.encode_prompt)

    def decode(self, ids: list[int]) -> str:
        with self._tok_lock:  # a tokenizer is not guaranteed thread-safe
            return decode_answer(self.tokenizer, ids, (), self.model.mask_id)

    # ---- checks (nothing reaches the decode loop unchecked) ----
    def check_settings(self, s: DecodeSettings, *, gen_length: int = 1,
                       prompt: Sequence[int] = (0,)) -> None:
        """``DecodeSettings.resolve``, the checks ``dllm.generate`` runs, on this model and prompt:
        BadRequest naming the request field the ``SettingError`` names."""
        try:
            sampler = s.resolve(self.model, [list(prompt)], gen_length).sampler
        except SettingError as err:
            raise BadRequest(request_param(err.field, s), str(err)) from None
        for name in type(sampler).loads:  # a model or file: the server's own, never one the request names
            value, own = getattr(sampler.config, name), self._own_value(type(sampler), name)
            if value != own:
                raise BadRequest(request_param(name, s), f"sampler {sampler.name!r}: {name} loads a model or file, "
                                                         f"which this server fixes ({own!r}; set it when starting "
                                                         f"the server: --sampler {sampler.name} -o {name}=...); "
                                                         f"got {value!r}")

    def _own_value(self, cls: type, name: str):
        """The server's value of option ``name`` of sampler class ``cls``: its default sampler's when that is
        ``cls`` (``--sampler`` / ``-o``), else the option's default."""
        default = make_sampler(self.defaults.sampler, **dict(self.defaults.options))
        if type(default) is cls:
            return getattr(default.config, name)
        return next(f.default for f in dataclasses.fields(cls.Config) if f.name == name)

    def check(self, request: JobRequest) -> None:
        if not isinstance(request.settings, DecodeSettings):
            raise BadRequest(None, f"a diffusion backend takes DecodeSettings, got {type(request.settings).__name__}")
        self.check_length(request, "model")
        self.check_settings(request.settings, gen_length=request.max_tokens, prompt=request.prompt_ids)

    # ---- decoding ----
    def _new_row(self, job: Job, r: int, revises: bool) -> _Row:
        return _Row(job, r, TextStream(self.decode, self.eos_ids, job.request.stop), revises, self._pieces)

    def _run_jobs(self, jobs: list[Job]) -> Optional[list[Job]]:
        """Continuous mode, settings one canvas can serve (``dllm.serve.backends.scheduling.joined``): the jobs
        join the running decode of their key (returned: it ends them), or start it and run it here.
        Otherwise one ``generate`` call on the group's prompts: a decode of the step loop, its
        forwards merged with the other decodes'."""
        key = self._joined_key(jobs)
        if key is None:
            self._decode(jobs, self._served)
            return None
        running = self._joined.get(key)
        if running is not None:
            running.admit(jobs)
            return jobs
        running = self._joined[key] = JoinedDecode(self, key[0], key[1])
        running.admit(jobs)
        try:
            running.run()
        finally:
            del self._joined[key]
        return jobs

    def _joined_key(self, jobs: list[Job]) -> Optional[tuple]:
        """The key of the running decode the jobs may join (``dllm.engine.running``), or None: joining
        off (``join=False``), not in continuous mode, or settings one canvas cannot serve."""
        if not self.join or self.mode != "continuous":
            return None
        r = jobs[0].request
        settings = dataclasses.replace(r.settings, seed=None)
        group = self._groups.get((settings, r.max_tokens), ())
        if group == ():
            if len(self._groups) >= 4096:  # requests' own settings: keep the memo bounded
                self._groups.clear()
            group = self._groups[settings, r.max_tokens] = group_of(self.model, settings, r.max_tokens)
        return None if group is None else (settings, group)

    def _decode(self, jobs: list[Job], model) -> None:
        """``generate`` on the jobs' prompts as one batch (rows decode as they would alone). A row whose
        answer is final (EOS or a stop string in its final prefix) is done at once, a cancelled one
        fails at once, and either is released from the call (``dllm.rows.release_rows``: no later
        forward computes it); the call ends early when no row is left."""
        req, started = jobs[0].request, time.perf_counter()
        sampler = make_sampler(req.settings.sampler, **dict(req.settings.options))
        # a sampler that re-masks (revises) or rewrites (refines: DMax) committed tokens of its block: only
        # the blocks before the current one are final
        rows = [self._new_row(job, r, sampler.revises or sampler.refines) for r, job in enumerate(jobs)]
        live = set(range(len(rows)))

        events = any(j.request.step_events for j in jobs)
        # the canvas is read each step only where a row needs it: streamed text, stop strings, step
        # events; otherwise a row ends with the call (generate's own EOS rule releases it early)
        watch = any(j.request.stream or j.request.stop or j.request.step_events for j in jobs)

        def on_step(state) -> None:
            left = []
            generated = traces = None
            if watch:  # the step's one read, every row at once, joined with the other decodes' reads
                got = self.read([state.generated, state.trace] if events else [state.generated])
                generated, traces = got[0], (got[1] if events else None)
            for r in list(live):
                row = rows[r]
                if row.job.cancelled:
                    row.job.emit(Failed("cancelled by the client", 499))
                    left.append(r)
                elif generated is not None and row.observe(state, generated[r], traces):
                    row.finish(None, req.max_tokens, started)
                    left.append(r)
            live.difference_update(left)
            if self.mirror is not None:  # the other ranks release the same rows (or end) at this step
                self.mirror.step(left, not live)
            if not live:
                raise _Leave
            if left:  # the call goes on without them: their rows leave its forwards (dllm.rows)
                release_rows(state, left)

        prompts = [list(j.request.prompt_ids) for j in jobs]
        # tokens_per_step (k) becomes steps over the call's block plan, as check_settings resolved it
        kwargs = req.settings.with_steps(self.model, prompts, req.max_tokens).generate_kwargs()
        seeds = [j.request.settings.seed for j in jobs]
        kwargs["seed"] = None if all(s is None for s in seeds) else seeds  # one generator per row
        kwargs.update(gen_length=req.max_tokens, stop_at_eos=True)
        if self.mirror is not None:
            self.mirror.begin(Call(prompts, kwargs))
        try:
            out = generate(model, prompts, callback=on_step, **kwargs)
        except _Leave:
            return
        answers = out.generated_ids  # read once by generate, every row
        for r in sorted(live):
            row = rows[r]
            row.nfe, row.forwarded = out.nfe, out.forwarded_tokens
            row.finish(answers[r], req.max_tokens, started)

    def close(self, drain: bool = True, timeout: Optional[float] = None) -> None:
        """``Scheduler.close``, then (a split model) the other ranks are stopped."""
        super().close(drain, timeout)
        if self.mirror is not None:
            self.mirror.close()

    # ---- batching ----
    def _key(self, job: Job) -> tuple:
        """Jobs that can share one ``generate`` call: same settings but the seed (each row draws from
        its own generator), length and stops (and, for a block-causal model, prompts ending at the
        same offset in a block: the rows share blocks). Prompts of any length share a call: it pads
        its rows to the longest as a merged forward would."""
        r = job.request
        offset = None if self.block_size is None else len(r.prompt_ids) % self.block_size
        return dataclasses.replace(r.settings, seed=None), r.max_tokens, r.stop, offset


__all__ = ["DiffusionBackend", "MODES"]
