"""``dllm serve``: an OpenAI-compatible server (``dllm.serve.http.app`` under uvicorn).

    dllm serve --model tiny-llada [--sampler SPEC --cache SPEC --block-length N ...] [--port 8000]
    dllm serve --target tiny-ar --drafter dflash:model=tiny-ar-dflash [--tree SPEC --block-size N|auto]

Flags are checked, the chat template read and the port bound before any model loads (a taken port
or a missing file is an error message and exit status 2, not a traceback after a minute of
loading). The default bind is 127.0.0.1; another host without ``--api-key`` gets a warning.
SIGTERM (or Ctrl-C) drains: the listener stays open and answers every new request with 503 +
Retry-After while the requests in flight finish (at most ``--drain-timeout`` seconds; each one still
unfinished then ends with a 503: an error body, or a last error event and ``[DONE]`` when streamed);
then the listener closes, the backend stops and the process exits 0. A second signal ends the requests
in flight at once (503 each); a third quits without waiting.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any, Optional

from dllm.cli.args import (POSITIVE, add_quantization, add_threads, at_least, block_size, call_cost_tokens,
                           flag_plan, option, option_dict)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
DIFFUSION_ONLY = ("sampler", "cache", "block_length", "steps", "temperature", "seed", "option", "mode",
                  "max_batch_rows", "max_batch_tokens", "call_cost_tokens", "max_group", "join", "tensor_parallel")
SPEC_ONLY = ("drafter", "tree", "block_size")


def serve_args(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a diffusion model: local dir, hub id, or embedded name (tiny-llada)")
    what.add_argument("--target", help="an autoregressive target for speculative decoding (tiny-ar); needs --drafter")
    p.add_argument("--served-model-name", default=None, help="the model id of /v1/models (default: --model/--target)")
    d = p.add_argument_group("diffusion defaults (a request's own fields override them)")
    d.add_argument("--sampler", default=None, help="sampler spec (default low_confidence; see `dllm samplers`)")
    d.add_argument("--cache", default=None, metavar="SPEC", help="cache policy spec (default none)")
    d.add_argument("--block-length", type=POSITIVE, default=None, help="default block length of a request (default: its max_tokens, one block)")
    d.add_argument("--steps", type=POSITIVE, default=None, help="default steps of a fixed-step sampler (default: one token per step)")
    d.add_argument("--temperature", type=float, default=None, help="default temperature (default 0: greedy)")
    d.add_argument("--seed", type=at_least(0), default=None, help="default seed of a request (default: none)")
    d.add_argument("--option", "-o", action="append", type=option, default=[], metavar="NAME=VALUE",
                   help="sampler option of the default sampler, repeatable")
    d.add_argument("--mode", choices=("continuous", "static", "serial"), default=None,
                   help="batching: continuous (default; requests join and leave the running batch), static "
                        "(a batch runs to its end), serial (one at a time)")
    d.add_argument("--max-batch-rows", type=POSITIVE, default=None,
                   help="continuous mode: rows in one merged forward (default 64)")
    d.add_argument("--max-batch-tokens", type=POSITIVE, default=None,
                   help="continuous mode: rows x padded length of one merged forward (default 65536)")
    d.add_argument("--call-cost-tokens", type=call_cost_tokens, default=None,
                   help="continuous mode: what one forward call costs beyond its tokens, in tokens, for merging "
                        "forwards and splitting a running decode's (default auto: measured for the model on its "
                        "device at start, two forwards timed; large where a call is launch-bound, a small model "
                        "on a GPU; tens of tokens of a small model on a CPU core)")
    d.add_argument("--max-group", type=POSITIVE, default=None,
                   help="continuous mode: queued requests with the same settings (seeds aside) and length start as "
                        "one generate call of at most this many rows (default: --max-running)")
    d.add_argument("--no-join", dest="join", action="store_const", const=False, default=None,
                   help="continuous mode: every group of requests runs as its own generate call, also where "
                        "one running decode could hold them all (no cache, a sampler that reads no step index: "
                        "dllm.serve.backends.scheduling.joined)")
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--drafter", default=None, help="drafter spec (see `dllm drafters`): dflash:model=tiny-ar-dflash")
    s.add_argument("--tree", default=None, help="verify draft trees: a tree builder spec (ddtree:budget=64)")
    s.add_argument("--block-size", type=block_size, default=None,
                   help="tokens per verification forward, or 'auto' (the drafter's block head)")
    h = p.add_argument_group("server")
    h.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    h.add_argument("--port", type=at_least(0), default=8000, help="0: any free port (printed)")
    h.add_argument("--api-key", default=os.environ.get("DLLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/... (default: $DLLM_API_KEY, else none)")
    h.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template file (as vLLM's), for models whose tokenizer has none")
    h.add_argument("--max-running", type=POSITIVE, default=None, help="requests decoding at once (default 32; "
                                                                      "speculative 8)")
    h.add_argument("--max-queue", type=POSITIVE, default=256, help="waiting requests; more get 429")
    h.add_argument("--max-running-tokens", type=POSITIVE, default=1 << 20,
                   help="prompt + max_tokens summed over the running requests")
    h.add_argument("--max-tokens-limit", type=POSITIVE, default=None,
                   help="the largest max_tokens a request may ask for (default: the model's positions - 1)")
    h.add_argument("--default-max-tokens", type=POSITIVE, default=16, help="max_tokens of a request that gives none")
    h.add_argument("--max-body-bytes", type=POSITIVE, default=1 << 20, help="larger request bodies get 400")
    h.add_argument("--drain-timeout", type=float, default=None,
                   help="seconds in-flight requests get after SIGTERM / Ctrl-C; those still running then end with "
                        "a 503 (default: as long as they need)")
    h.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level (default: info)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
    add_quantization(p)
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cpu)")
    t = p.add_argument_group("a model split over ranks (docs/guides/parallel.md)")
    t.add_argument("--tensor-parallel", type=POSITIVE, default=None, metavar="N",
                   help="split the --model over N processes (this one and N-1 it starts; gloo on CPU, NCCL on GPU); "
                        "served with --mode static (default) or serial")
    t.add_argument("--expert-parallel", action="store_true",
                   help="with --tensor-parallel: whole MoE experts per rank (LLaDA 2) instead of split columns")
    r = p.add_argument_group("replicas (Ray Serve, extra dllm[ray])")
    r.add_argument("--replicas", type=POSITIVE, default=None,
                   help="serve N copies of the backend behind one endpoint through Ray Serve (default: one "
                        "backend in this process)")
    r.add_argument("--ray-address", default=None,
                   help="join a running Ray cluster (e.g. auto); default: start a local Ray")
    r.add_argument("--gpus-per-replica", type=float, default=0.0, help="each replica's Ray GPU share (default 0)")
    add_threads(p)


def check_args(args: argparse.Namespace) -> None:
    """Everything that can be refused before a model loads."""
    given = lambda name: getattr(args, name) not in (None, [])  # noqa: E731
    if args.target is not None:
        if args.drafter is None:
            raise ValueError("--target needs --drafter (dflash:model=tiny-ar-dflash, ngram, dlm:model=tiny-llada)")
        wrong = [n for n in DIFFUSION_ONLY if given(n)]
        if wrong:
            raise ValueError(f"--{wrong[0].replace('_', '-')} is a diffusion setting; a --target server takes "
                             f"--drafter, --tree, --block-size (a request's temperature, top_p, top_k, seed)")
    else:
        wrong = [n for n in SPEC_ONLY if given(n)]
        if wrong:
            raise ValueError(f"--{wrong[0].replace('_', '-')} is for --target (speculative decoding), not --model")
    if args.temperature is not None and not 0 <= args.temperature < float("inf"):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.port > 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty; give a key or leave the flag out")
    if args.replicas is not None and args.port == 0:
        raise ValueError("--replicas needs a fixed --port (Ray Serve's proxy binds it; 0 = any port is not supported)")
    if args.replicas is None and (args.ray_address is not None or args.gpus_per_replica):
        raise ValueError("--ray-address and --gpus-per-replica go with --replicas N")
    if args.expert_parallel and args.tensor_parallel is None:
        raise ValueError("--expert-parallel goes with --tensor-parallel N (the ranks the experts are placed on)")
    if args.tensor_parallel is not None:
        from dllm.serve.backends.diffusion import MIRRORED_MODES

        if args.mode is not None and args.mode not in MIRRORED_MODES:
            raise ValueError(f"--tensor-parallel serves with --mode {' or '.join(MIRRORED_MODES)} (one generate call "
                             f"at a time, which the other ranks replay), not {args.mode}")
        if args.quantization is not None:
            raise ValueError(f"--tensor-parallel with --quantization {args.quantization} is not supported: load a "
                             f"floating dtype")
    if args.drain_timeout is not None and not args.drain_timeout > 0:
        raise ValueError(f"--drain-timeout must be > 0 seconds, got {args.drain_timeout}")


def check_specs(args: argparse.Namespace) -> None:
    """The default sampler, its options and the cache policy, built once without a model (cheap), so
    a typo is refused before the model loads; the backend checks them against the model again."""
    if args.model is None:
        return
    from dllm.cache import make_cache
    from dllm.samplers import make_sampler

    for flag, make in (("--sampler", lambda: make_sampler(args.sampler or "low_confidence", **option_dict(args.option))),
                       ("--cache", lambda: make_cache(args.cache or "none"))):
        try:
            make()
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{flag}: {err}") from None


def read_chat_template(path: Optional[str]) -> Optional[str]:
    if path is None:
        return None
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--chat-template {path!r}: no such file (give a Jinja template file)")
    text = file.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"--chat-template {path!r} is empty")
    return text


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound and listening now (a taken port is refused before the model loads;
    a client that connects as soon as the address is printed waits in the backlog until uvicorn
    accepts, instead of being refused before uvicorn's own ``listen``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as err:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.set_inheritable(True)
    return sock


def build_backend(args: argparse.Namespace, chat_template: Optional[str]) -> Any:
    """The backend the flags describe (loads the model)."""
    name = args.served_model_name or args.model or args.target
    if args.target is not None:
        from dllm.drafters.base import make_drafter
        from dllm.models.targets import load_target, resolve_target
        from dllm.serve.backends.speculative import SpeculativeBackend

        found = resolve_target(args.target)
        drafter = make_drafter(args.drafter)
        plan = flag_plan(args.block_size, args.tree)
        target, tok = load_target(found, dtype=args.dtype, device=args.device, quantization=args.quantization)
        return SpeculativeBackend(target, tok, drafter=drafter, plan=plan, name=name,
                                  max_running=args.max_running or 8, max_queue=args.max_queue,
                                  max_running_tokens=args.max_running_tokens,
                                  max_tokens_limit=args.max_tokens_limit, chat_template=chat_template)
    from dllm.models import load
    from dllm.serve.backends.scheduling.batcher import BatcherConfig
    from dllm.serve.backends.diffusion import DiffusionBackend
    from dllm.settings import DecodeSettings

    defaults = DecodeSettings(sampler=args.sampler or "low_confidence", cache=args.cache or "none",
                              block_length=args.block_length, steps=args.steps,
                              temperature=args.temperature or 0.0, seed=args.seed,
                              options=tuple(sorted(option_dict(args.option).items())))
    call_cost = args.call_cost_tokens  # default: measured at start, except on ranks that must forward together
    if call_cost is None and args.tensor_parallel is None:
        call_cost = "auto"
    batcher = BatcherConfig(**{k: v for k, v in (("max_rows", args.max_batch_rows),
                                                  ("max_tokens", args.max_batch_tokens),
                                                  ("call_cost_tokens", call_cost)) if v is not None})
    mirror, mode = None, args.mode or "continuous"
    if args.tensor_parallel is not None:
        model, mirror = load_split_model(args)
        mode = args.mode or "static"
    else:
        model = load(args.model, dtype=args.dtype, device=args.device, quantization=args.quantization)
    return DiffusionBackend(model, name=name, defaults=defaults, mode=mode, mirror=mirror,
                            max_running=args.max_running or 32, max_queue=args.max_queue,
                            max_running_tokens=args.max_running_tokens, max_tokens_limit=args.max_tokens_limit,
                            chat_template=chat_template, batcher=batcher, join=args.join is not False,
                            **({"max_group": args.max_group} if args.max_group is not None else {}))


def load_split_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """``--tensor-parallel N``: ``dllm.serve.backends.tensor_parallel.split_model`` with the flags."""
    from dllm.serve.backends.tensor_parallel import split_model

    return split_model(args.model, args.tensor_parallel, dtype=args.dtype, device=args.device,
                       expert_parallel=args.expert_parallel, threads=args.threads)


HTTP_GRACE_S = 10  # once the backend is closed, how long uvicorn waits for the last replies to be written


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from dllm.serve.http.app import begin_drain, create_app, end_drain

    check_args(args)
    check_specs(args)
    chat_template = read_chat_template(args.chat_template)
    if args.replicas is not None:
        return run_replicas(args, chat_template)
    sock = bind(args.host, args.port)
    if args.host not in LOOPBACK and args.api_key is None:
        print(f"dllm serve: warning: listening on {args.host} without --api-key: anyone who can reach this "
              f"machine can use the server", file=sys.stderr)
    try:
        backend = build_backend(args, chat_template)
    except BaseException:  # a model that fails to load (or Ctrl-C while it loads): the port is freed now
        sock.close()
        raise
    app = create_app(backend, api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                     default_max_tokens=args.default_max_tokens, drain_timeout=args.drain_timeout)

    class DrainingServer(uvicorn.Server):
        """The first SIGTERM / Ctrl-C drains (``begin_drain``: new requests get 503 on the open listener,
        the requests in flight finish or end with 503 at ``--drain-timeout``); once the backend is
        closed uvicorn stops (the listener closes, the last replies are written: exit 0). A second
        signal ends the requests in flight now (``end_drain``); a third quits at once (uvicorn's force
        exit, the signal raised again after it)."""

        signals = 0

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.signals += 1
            if self.signals == 1:
                begin_drain(app).add_done_callback(lambda _: setattr(self, "should_exit", True))
            elif self.signals == 2:
                end_drain(app)
            else:
                self._captured_signals.append(sig)
                self.should_exit = self.force_exit = True

    config = uvicorn.Config(app, log_level=args.log_level, lifespan="on", timeout_graceful_shutdown=HTTP_GRACE_S)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"dllm serve: {backend.model_name} ({backend.kind}) on http://{shown}:{port} (OpenAI API under /v1, "
          f"the page at /)", file=sys.stderr, flush=True)
    DrainingServer(config).run(sockets=[sock])
    print("dllm serve: stopped", file=sys.stderr, flush=True)
    return 0


def run_replicas(args: argparse.Namespace, chat_template: Optional[str]) -> int:
    """``--replicas N``: N copies of exactly the backend the flags build (each replica loads its own
    model) behind Ray Serve's proxy on ``--host:--port`` (``dllm.serve.ray_app``)."""
    import functools

    from dllm.serve import ray_app

    app = ray_app.application(
        functools.partial(build_backend, args, chat_template), replicas=args.replicas, api_key=args.api_key,
        num_gpus=args.gpus_per_replica, threads=args.threads,
        app_options=dict(max_body_bytes=args.max_body_bytes, default_max_tokens=args.default_max_tokens,
                         drain_timeout=args.drain_timeout))
    print(f"dllm serve: {args.replicas} replicas of {args.served_model_name or args.model or args.target} through "
          f"Ray Serve on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    ray_app.run(app, host=args.host, port=args.port, address=args.ray_address)
    print("dllm serve: stopped", file=sys.stderr, flush=True)
    return 0


__all__ = ["HTTP_GRACE_S", "build_backend", "check_args", "check_specs", "read_chat_template", "run_replicas",
           "run_serve", "serve_args"]
