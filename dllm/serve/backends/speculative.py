"""Serving an autoregressive target with speculative decoding (``dllm.speculative_generate``).

Every request runs the real ``speculative_generate`` on its prompt alone, so a served request
returns exactly the offline tokens (greedy, or sampled with its seed). Requests are jobs of the one
scheduler (``dllm.serve.backends.scheduling.scheduler``): each runs as a greenlet on its loop thread and yields
its turn after every verification round (``Scheduler.yield_turn``), so the running requests take
turns round by round, first come first served. A request joins at its prefill and leaves after its
last round, and each round's accepted tokens are final, so they stream as one delta per round.
Rounds of different requests are not merged into one forward (their caches differ in length); one
thread keeps one forward on the machine at a time.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional, Sequence, Union

from dllm.drafters.base import make_drafter
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan, as_plan
from dllm.drafters.target import Target, check_tree_room
from dllm.drafters.verify import SamplingParams
from dllm.serve.backends.base import BadRequest
from dllm.serve.backends.jobs import Delta, Done, Failed, Job, JobRequest, SpeculativeSettings
from dllm.serve.backends.prompts import chat_ids, text_ids
from dllm.serve.backends.scheduling.policy import Continuous
from dllm.serve.backends.scheduling.scheduler import Scheduler, SchedulerConfig, max_tokens_limit as default_limit
from dllm.serve.backends.stream import TextStream
from dllm.settings import SettingError, check_call_seed


class _Leave(Exception):
    pass


def plan_trees(plan: Plan, drafter: Any) -> list[Any]:
    """The tree builders a plan's rounds may use (``speculative_generate``: the plan's tree, or the
    trees its block head picks from), built once; empty for the chain."""
    from dllm.drafters.trees.builders import make_tree_builder

    specs = [] if plan.tree is None else [plan.tree]
    if plan.head is not None:
        head = getattr(drafter, "block_head", None) if isinstance(plan.head, str) else plan.head
        specs += list(getattr(head, "tree_specs", None) or [])
    return [make_tree_builder(spec) for spec in specs]


class SpeculativeBackend(Scheduler):
    """Serves a transformers causal LM with a drafter (``dllm.load_target`` + a drafter spec)."""

    kind = "speculative"

    def __init__(self, target, tokenizer, *, drafter: Any, name: str, plan: Any = None,
                 max_running: int = 8, max_queue: int = 256, max_running_tokens: int = 1 << 20,
                 max_tokens_limit: Optional[int] = None, chat_template: Optional[str] = None) -> None:
        if tokenizer is None:
            raise ValueError("a served target needs its tokenizer (dllm.load_target returns it)")
        self.target, self.tokenizer, self.model_name = target, tokenizer, name
        self.defaults = SpeculativeSettings()  # greedy unless a request asks
        self.plan = as_plan(plan)
        self.drafter = make_drafter(drafter)  # loaded once, shared (each call begins its own session)
        self._trees = plan_trees(self.plan, self.drafter)  # each must fit the target's positions
        tgt = Target(target, taps=self.drafter.target_layers, tokenizer=tokenizer)
        for builder in self._trees:  # a target that cannot verify trees is refused at start, not per request
            tgt.check_tree(f"the draft trees of {builder.spec!r}")
        info = tgt.info
        self.drafter.check_target(info)
        self.eos_ids = frozenset(info.eos_ids)
        self.vocab_size = info.vocab_size
        cfg = getattr(target, "config", None)
        self.max_positions = getattr(cfg, "max_position_embeddings", None)
        self.max_tokens_limit = default_limit(max_tokens_limit, self.max_positions)
        self.chat_template = chat_template
        self._tok_lock = threading.Lock()
        self.target_forwards = 0
        self.rounds_run = 0
        super().__init__(SchedulerConfig(max_running=max_running, max_queue=max_queue,
                                         max_running_tokens=max_running_tokens), Continuous(max_group=1))
        self.start()

    def resolve_settings(self, *, max_tokens: int, temperature: Optional[float] = None,
                         top_p: Optional[float] = None, top_k: Optional[int] = None,
                         seed: Optional[int] = None) -> SpeculativeSettings:
        """A request's settings (OpenAI's defaults where it gives none: greedy unless asked)."""
        return SpeculativeSettings(temperature=0.0 if temperature is None else temperature,
                                   top_p=1.0 if top_p is None else top_p, top_k=0 if top_k is None else top_k,
                                   seed=seed)

    # ---- prompts ----
    def encode_prompt(self, prompt: Union[str, Sequence[int]]) -> tuple[int, ...]:
        from dllm.inputs import prompt_rows
        from dllm.models.text.tokenizer import encode_text

        def encode(p):
            with self._tok_lock:
                return prompt_rows([p], lambda t: encode_text(self.tokenizer, t), self.vocab_size,
                                   vocab_name="the target's vocabulary ")[0]

        return text_ids(encode, prompt)

    def encode_chat(self, messages: Sequence[dict]) -> tuple[int, ...]:
        template = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise BadRequest("messages", f"target {self.model_name!r} has no chat template (its tokenizer ships "
                                         f"none); start the server with --chat-template FILE")
        return chat_ids(self.tokenizer, template, messages, self.encode_prompt)

    def decode(self, ids: list[int]) -> str:
        with self._tok_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ---- checks ----
    def check(self, request: JobRequest) -> None:
        s = request.settings
        if not isinstance(s, SpeculativeSettings):
            raise BadRequest(None, "a speculative server takes no diffusion settings (sampler, cache, "
                                   "block_length, steps, sampler_options)")
        self.check_length(request, "target")
        try:  # the checks speculative_generate runs
            SamplingParams(s.temperature, s.top_k, s.top_p)
            check_call_seed(s.seed)
        except SettingError as err:
            raise BadRequest(err.field, str(err)) from None
        for builder in self._trees:  # a round's tree sits on top of the prompt + max_tokens
            try:
                check_tree_room(builder, self.target, len(request.prompt_ids) + request.max_tokens)
            except ValueError as err:
                raise BadRequest("max_tokens", str(err)) from None

    # ---- decoding ----
    def _run_jobs(self, jobs: list[Job]) -> None:
        (job,) = jobs  # every request alone (the policy's groups of one)
        req, s, started = job.request, job.request.settings, time.perf_counter()
        stream = TextStream(self.decode, self.eos_ids, req.stop)
        first: list[float] = []

        def send(ids: list[int], complete: bool) -> None:
            text, new = stream.update(ids, complete=complete)
            if text:
                if not first:
                    first.append(time.perf_counter())
                job.emit(Delta(text, new))

        def on_round(generated: list[list[int]]) -> None:
            if job.cancelled:
                raise _Leave
            send(generated[0], complete=False)
            self.yield_turn()

        try:
            out = speculative_generate(self.target, self.drafter, [list(req.prompt_ids)],
                                       max_new_tokens=req.max_tokens, temperature=float(s.temperature),
                                       top_p=float(s.top_p), top_k=int(s.top_k), seed=s.seed,
                                       plan=self.plan, stop=list(req.stop) or None, tokenizer=self.tokenizer,
                                       callback=on_round)
        except _Leave:
            job.emit(Failed("cancelled by the client", 499))
            return
        send(out.generated[0], complete=True)
        self.target_forwards += out.target_forwards  # the loop thread alone writes these
        self.rounds_run += out.rounds
        accepted = out.acceptance[0]
        now = time.perf_counter()
        job.emit(Done(text=stream.text, token_ids=tuple(stream.answer_ids),
                      finish_reason="length" if out.stop_reasons[0] == "length" and stream.ended is None else "stop",
                      prompt_tokens=len(req.prompt_ids), completion_tokens=len(stream.answer_ids),
                      nfe=out.target_forwards, queue_s=started - job.submitted,
                      ttft_s=first[0] - job.submitted if first else None, wall_s=now - job.submitted,
                      acceptance=sum(accepted) / len(accepted) if accepted else None))

    def _forwards(self) -> tuple[int, int]:
        return self.target_forwards, self.target_forwards


__all__ = ["SpeculativeBackend"]
