"""The lm-evaluation-harness model ``dllm``: any dllm model, decoded by any registered sampler and cache.

    python -m dllm.eval.harness --model dllm --tasks stress_pb_mini \\
        --model_args pretrained=tiny-llada,sampler=fast,cache=dual,block_length=32,threshold=0.9
    accelerate launch --multi_gpu --num_processes 2 -m dllm.eval.harness --model dllm ...   # data parallel

``python -m dllm.eval.harness`` is lm-eval's own command line with this model registered and the
stress tasks' directory (``dllm/eval/harness/lm_tasks``) as ``--include_path``. Importing this module
registers the model for ``lm_eval.simple_evaluate(model="dllm", ...)``.

model_args (``HarnessConfig``; any other key is an option of the sampler, validated against its
Config): ``pretrained`` (embedded name, local directory or Hub id, ``oracle``), ``sampler``,
``cache``, ``gen_length``, ``block_length``, ``tokens_per_step``, ``stop_at_eos``, ``temperature``,
``cfg_scale``, ``mc_num``, ``check_greedy``, ``batch_size``, ``seed``, ``dtype``, ``device``,
``attn_backend``, ``add_bos_token``, ``max_length``. model_args win over ``--batch_size`` and
``--device``, which lm-eval always passes (defaults 1 and ``cuda:0``); a ``--device`` this machine
lacks falls back to the best available device with a warning.

lm-eval splits ``model_args`` at every comma, so a cache policy with several options is written with
semicolons between them, ``cache=dual:look_back=16;look_ahead=16``, or one key per option,
``cache=dual,cache_look_back=16,cache_look_ahead=16``; a k in the sampler spec
(``sampler=low_confidence:k=2``) is ``tokens_per_step``. Setting one option twice is an error
(``harness.config``).

- ``generate_until``: requests are grouped by generation settings and decoded in batched
  ``dllm.generate`` calls of ``batch_size`` left-padded rows (the engine decodes a row alike alone
  or in a batch). A request's ``max_gen_toks`` caps the canvas (``gen_length``). A block-causal
  model (SDAR, Fast-dLLM v2) decodes on its trained block grid, a batch holding prompts that end at
  the same offset in it. The text is cut at
  the first EOS/EoT and decoded without special tokens, then cut at the first ``until`` string;
  with the generation kwarg ``keep_special_tokens: true`` it is the whole generated region with
  its special tokens (the stress tasks' scorer reads the EOS padding). Sampled decoding draws each
  request from its own seed (``generation_seeds``: ``seed``, the prompt, the k-th copy of a repeated
  request), so a text does not depend on batching or order and lm-eval's ``repeats`` are distinct draws.
- ``loglikelihood``: LLaDA's Monte-Carlo estimate and greedy check (``harness.likelihood``);
  ``loglikelihood_rolling``: the same estimate of the whole text after a BOS (or EOS) token.
- Chat templates: ``apply_chat_template`` renders with the model's template (the tokenizer's own
  or the family default).
- Data parallel: launched as several processes (``accelerate launch --multi_gpu --num_processes N``
  or ``torchrun --nproc_per_node N``; without a GPU too, the processes then share a gloo group),
  ``rank``/``world_size`` come from ``accelerate.Accelerator`` and lm-eval shards the requests;
  ``all_gather`` goes through accelerate, ``gather_object`` through ``dllm.models.parallel.objects``
  (torch's, returning only once Gloo's workers let go of its tensors: lm-eval's last gather can no
  longer abort a CPU process at exit). Note that
  ``accelerate launch --cpu --num_processes N`` starts a single process (accelerate's multi-CPU
  launch needs mpirun and a hostfile).

Source for the likelihood and the shape of the class: ML-GSAI/LLaDA ``eval_llada.py``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from typing import Any, Optional, Sequence

import torch
from lm_eval.api.model import LM

from dllm.cache.block_causal import block_size_of
from dllm.eval.harness.config import decode_setting, default_device, split_model_args
from dllm.eval.harness.launch import accelerator, available_or_default, launched_processes
from dllm.models.parallel.objects import gather_object
from dllm.eval.harness.likelihood import LikelihoodConfig, MonteCarloLikelihood, request_seed, rolling_windows
from dllm.inputs import decode_answer
from dllm.models.text.tokenizer import encode_text
from dllm.settings import steps_for  # noqa: F401  (k -> steps, re-exported for the harness's users)

log = logging.getLogger(__name__)
MODEL_NAME = "dllm"


@dataclasses.dataclass(frozen=True)
class GenRequest:
    """One ``generate_until`` request, encoded."""

    ids: list[int]  # prompt token ids
    gen_length: int  # canvas length G
    temperature: float
    until: tuple[str, ...]  # stop strings
    keep_special: bool  # the whole region with its special tokens (no EOS cut)


def cut_at_stops(text: str, until: Sequence[str]) -> str:
    """``text`` up to the earliest occurrence of any stop string (all of it when none occurs)."""
    cuts = [text.find(s) for s in until if s]
    cuts = [c for c in cuts if c >= 0]
    return text[:min(cuts)] if cuts else text


def generation_seeds(seed: int, plans: Sequence[GenRequest]) -> list[int]:
    """One seed per ``generate_until`` request, from (seed, prompt ids, canvas length, occurrence):
    a request's sampled text depends neither on the batch it shares nor on the order of the requests,
    and the k-th copy of a repeated request (lm-eval's ``repeats``) draws its own sample."""
    seen: dict[tuple, int] = defaultdict(int)
    out = []
    for plan in plans:
        key = (tuple(plan.ids), plan.gen_length, plan.temperature)
        out.append(request_seed(seed, plan.ids, (plan.gen_length, seen[key])))
        seen[key] += 1
    return out


class DllmLM(LM):
    """lm-eval ``LM`` over a dllm model (module docstring)."""

    def __init__(self, **model_args: Any) -> None:
        super().__init__()
        self.config, self.sampler_options = split_model_args(model_args)
        self.setting = decode_setting(self.config, self.sampler_options)  # dllm.settings.DecodeSettings
        cfg = self.config
        self.accelerator = accelerator()
        if self.accelerator is not None:
            self._rank = self.accelerator.process_index
            self._world_size = self.accelerator.num_processes
            device = self.accelerator.device
        else:
            device = cfg.device or default_device()
        from dllm.models import load

        oracle = cfg.pretrained == "oracle"
        self.model = load(cfg.pretrained, dtype=None if oracle else cfg.dtype, device=device,
                          **({} if oracle else {"attn_backend": cfg.attn_backend}))
        self.model.eval()
        self._device = torch.device(device)
        if self.model.tokenizer is None:
            raise ValueError(f"model {cfg.pretrained!r} has no tokenizer; the lm-eval harness works on text "
                             f"(load a checkpoint that ships tokenizer files)")
        self.tokenizer = self.model.tokenizer
        self.max_length = cfg.max_length or int(self.model.max_positions)
        self.likelihood = MonteCarloLikelihood(LikelihoodConfig(cfg.mc_num, cfg.batch_size, cfg.cfg_scale, cfg.seed))
        self._warned: set[str] = set()

    # ---- construction from lm-eval's arguments ------------------------------------------------------
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: Optional[dict] = None) -> "DllmLM":
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: Optional[dict] = None) -> "DllmLM":
        """model_args win over lm-eval's ``batch_size``/``device`` (which it always passes, with
        defaults 1 and ``cuda:0``); ``max_batch_size`` is ignored."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k != "max_batch_size"}
        if "device" in extra and ("device" in arg_dict or launched_processes() > 1):
            del extra["device"]  # model_args' device wins; under accelerate each process has its own
        elif "device" in extra:
            extra["device"] = available_or_default(str(extra["device"]))
        return cls(**{**extra, **arg_dict})

    # ---- lm-eval properties ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        name = getattr(self.tokenizer, "name_or_path", "") or self.config.pretrained
        return str(name).replace("/", "__")

    def chat_template(self, chat_template: Any = False) -> Optional[str]:
        return self.model.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        template = self.model.usable_chat_template(hint="run lm-eval without --apply_chat_template")
        kwargs = dict(chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt,
                      continue_final_message=not add_generation_prompt)
        try:
            return self.tokenizer.apply_chat_template(chat_history, **kwargs)
        except Exception as err:  # jinja2 TemplateError: a template without a system role (as lm-eval's HFLM)
            if not any(m.get("role") == "system" for m in chat_history):
                raise
            self._warn_once("system", f"chat template failed ({err}); retrying without the system message")
            return self.tokenizer.apply_chat_template([m for m in chat_history if m.get("role") != "system"],
                                                      **kwargs)

    # ---- data parallel ---------------------------------------------------------------------------------
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.accelerator is None else self.accelerator.gather(tensor)

    def gather_object(self, obj: Any, dst: int = 0) -> Optional[list]:
        if self.accelerator is None:
            return [obj]
        return gather_object(obj, dst)  # returns after Gloo's workers let go of its tensors: no abort at exit

    def barrier(self) -> None:
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()

    # ---- tokens ----------------------------------------------------------------------------------------
    def tok_encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added; unknown words are an error naming them)."""
        return encode_text(self.tokenizer, text) if text else []

    @property
    def prefix_token_id(self) -> int:
        """The token an empty context stands for (lm-eval's convention): BOS, else EOS."""
        bos = self.model.bos_id
        return bos if bos is not None else self.model.eos_id

    def encode_context(self, text: str) -> list[int]:
        ids = self.tok_encode(text)
        bos = self.model.bos_id
        if self.config.add_bos_token and bos is not None and ids[:1] != [bos]:
            ids = [bos, *ids]
        return ids

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids) as lm-eval's ``TemplateLM`` splits them: trailing spaces of the
        context move to the continuation, the continuation is the tail of the encoded whole; an
        empty context is the prefix token. The context is cut from the left to fit ``max_length``."""
        if not context:
            ctx, cont = [self.prefix_token_id], self.tok_encode(continuation)
        else:
            n_spaces = len(context) - len(context.rstrip())
            if n_spaces:
                context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
            ctx = self.encode_context(context)
            whole = self.encode_context(context + continuation)
            cont = whole[len(ctx):]
        if len(cont) >= self.max_length:
            raise ValueError(f"continuation of {len(cont)} tokens does not fit max_length {self.max_length} "
                             f"with a context token")
        return ctx[-(self.max_length - len(cont)):], cont

    # ---- requests ----------------------------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self.encode_pair(*req.args[:2]) for req in requests]
        bar = self._progress(pairs, disable_tqdm, "loglikelihood")
        lls = [self.likelihood.estimate(self.model, c, a) for c, a in bar]
        greedy = (self.likelihood.greedy_matches(self.model, pairs, self.config.batch_size)
                  if self.config.check_greedy else [False] * len(pairs))
        out = list(zip(lls, greedy))
        for req, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for req in self._progress(requests, disable_tqdm, "loglikelihood_rolling"):
            windows = rolling_windows(self.tok_encode(req.args[0]), self.prefix_token_id, self.max_length)
            total = sum(self.likelihood.estimate(self.model, c, a) for c, a in windows)
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        plans = [self.plan_generation(*req.args[:2]) for req in requests]
        bs = block_size_of(self.model)  # a block-causal model: a batch's prompts share its block grid
        groups: dict[tuple[int, float, int], list[int]] = defaultdict(list)
        for i, plan in enumerate(plans):
            groups[(plan.gen_length, plan.temperature, len(plan.ids) % bs if bs else 0)].append(i)
        seeds = generation_seeds(self.config.seed, plans)
        texts: list[Optional[str]] = [None] * len(plans)
        bar = self._progress(None, disable_tqdm, "generate_until", total=len(plans))
        for (gen_length, temperature, _), idx in sorted(groups.items()):
            idx.sort(key=lambda i: -len(plans[i].ids))  # similar lengths share a batch: less padding
            for s in range(0, len(idx), self.config.batch_size):
                chunk = idx[s:s + self.config.batch_size]
                rows = self.decode([plans[i].ids for i in chunk], gen_length, temperature,
                                   seeds=[seeds[i] for i in chunk])
                for i, row in zip(chunk, rows):
                    texts[i] = self.region_text(row, plans[i])
                    self.cache_hook.add_partial("generate_until", requests[i].args, texts[i])
                bar.update(len(chunk))
        bar.close()
        return texts  # type: ignore[return-value]

    # ---- generation --------------------------------------------------------------------------------------
    def plan_generation(self, context: str, gen_kwargs: Optional[dict]) -> GenRequest:
        """Encode one request and read its generation kwargs (``until``, ``max_gen_toks``,
        ``do_sample``, ``temperature``, ``keep_special_tokens``; others are ignored with a warning)."""
        kw = dict(gen_kwargs or {})
        until = kw.pop("until", None) or ()
        until = (until,) if isinstance(until, str) else tuple(until)
        gen_length = self.config.gen_length
        max_gen = kw.pop("max_gen_toks", None)
        if max_gen is not None:
            gen_length = min(gen_length, _max_gen_toks(max_gen))
        do_sample = kw.pop("do_sample", None)
        temperature = kw.pop("temperature", None)
        if do_sample is False:
            temperature = 0.0
        elif temperature is None:  # as Hugging Face generate: sampling without a temperature means 1
            temperature = 1.0 if do_sample else self.config.temperature
        temperature = float(temperature)
        keep_special = bool(kw.pop("keep_special_tokens", False))
        if kw:
            self._warn_once("gen_kwargs:" + ",".join(sorted(kw)), f"generation kwargs {sorted(kw)} are ignored: "
                            f"the dllm model decodes with its sampler (model_args)")
        ids = self.encode_context(context)
        room = self.max_length - gen_length
        if room < 1:
            raise ValueError(f"gen_length {gen_length} leaves no room for a prompt in max_length {self.max_length}")
        if len(ids) > room:
            self._warn_once("truncate", f"prompts longer than {room} tokens are cut from the left "
                            f"(max_length {self.max_length} - gen_length {gen_length})")
            ids = ids[-room:]
        return GenRequest(ids, gen_length, temperature, until, keep_special)

    def decode(self, rows: list[list[int]], gen_length: int, temperature: float,
               seeds: Optional[list[int]] = None) -> list[list[int]]:
        """Generated ids [len(rows)][gen_length] of one batched ``dllm.generate`` call; ``seeds``: one
        per row (each row draws what it draws alone with its seed), None: the config's seed for the call."""
        from dllm.engine import generate

        bl = self.setting.block_length  # a block-causal model decodes on its own grid (None: its block)
        if block_size_of(self.model) is None:
            bl = min(bl or gen_length, gen_length)
        setting = self.setting.replace(block_length=bl, temperature=temperature,
                                       **({} if seeds is None else {"seed": list(seeds)}))
        out = generate(self.model, rows, gen_length=gen_length, stop_at_eos=self.config.stop_at_eos,
                       **setting.with_steps(self.model, rows, gen_length).generate_kwargs())
        return out.generated.tolist()

    def region_text(self, row: list[int], plan: GenRequest) -> str:
        if plan.keep_special:
            n = len(self.tokenizer)
            text = self.tokenizer.decode([t for t in row if t < n], skip_special_tokens=False)
        else:
            text = decode_answer(self.tokenizer, row, self.model.eos_ids, self.model.mask_id)
        return cut_at_stops(text, plan.until)

    # ---- helpers -----------------------------------------------------------------------------------------
    def _progress(self, items, disable: bool, what: str, total: Optional[int] = None):
        from tqdm import tqdm

        return tqdm(items, total=total, desc=f"dllm {what}", disable=disable or self.rank != 0)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)


def _max_gen_toks(value: Any) -> int:
    """A request's ``max_gen_toks`` (lm-eval's generation kwarg, from the task's ``generation_kwargs``) as
    a positive int; ValueError naming it otherwise (the canvas ``gen_length`` it caps would be empty)."""
    try:
        tokens = int(value)
    except (TypeError, ValueError):
        tokens = 0
    if tokens < 1:
        raise ValueError(f"generation kwarg max_gen_toks must be a positive integer (the generated tokens per "
                         f"request: the task's generation_kwargs or --gen_kwargs), got {value!r}")
    return tokens


def register() -> None:
    """Register ``DllmLM`` as lm-eval's model ``dllm`` (idempotent)."""
    from lm_eval.api import registry

    table = getattr(registry, "model_registry", None) or registry.MODEL_REGISTRY  # 0.4.10+ / a dict before
    if table.get(MODEL_NAME, None) is not DllmLM:
        registry.register_model(MODEL_NAME)(DllmLM)


def task_manager(include_defaults: bool = True):
    """An lm-eval ``TaskManager`` that knows the stress tasks (``include_defaults=False``: only them,
    without indexing lm-eval's own tasks, which takes seconds)."""
    from lm_eval.tasks import TaskManager

    from dllm.eval.harness.tasks import LM_TASKS_DIR

    return TaskManager(include_path=str(LM_TASKS_DIR), include_defaults=include_defaults)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """lm-eval's command line with the model registered and the stress tasks included."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    from dllm.eval.harness.tasks import LM_TASKS_DIR

    register()
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        args += ["--include_path", str(LM_TASKS_DIR)]
    sys.argv = [sys.argv[0], *args]
    cli_evaluate()


register()
