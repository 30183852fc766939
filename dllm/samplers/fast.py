"""``fast``: the recommended parallel sampler, a registered sampler chosen by measurement.

``fast`` is a preset: an existing sampler with chosen option defaults (``CHOICE``), registered under
its own name so that ``dllm.generate(model, prompt, sampler="fast")`` needs no options. Options
given by the caller still override the preset's defaults.

The choice follows the rule of ``dllm bench choose-fast`` (``dllm.eval.bench.choose.fast``): over the whole stress suite, on every
embedded model and on the oracle, a candidate must keep the accuracy of the one-token-per-step
reference (``low_confidence``) within 1 point, be at least as accurate as ``threshold`` (0.9), and
commit at least 1.2x its tokens per forward; among the candidates that pass, the one that forwards
the fewest tokens wins (the bar already guarantees the gain in forwards; above it, the least compute).
The measured choice and the candidates it beat are in docs/results/samplers.md ("Why ``fast`` is
what it is").
The preset also sets ``compact="auto"``: on CUDA its steps read nothing back to the host (static
variant batches, see ``dllm.samplers.lopa``: the same tokens for a few more forwards); elsewhere the
variant batch is compacted (the fewest forwarded tokens; the candidate counts read once per block, later
steps' with the engine's test of the block's masks). And ``stats="auto"``:
on CUDA the anchor's and the variants' arg-max and confidences come from one fused pass over the
logits (``dllm.kernels.triton.stats``, float32) instead of float64 / float32 softmaxes over the
vocabulary; the same tokens except where two candidates tie within float32 rounding
(tests/kernels/test_fused_sampler_stats.py); elsewhere the softmaxes. Re-run the choice when the embedded models change:

    dllm bench choose-fast --threads 1

The measurements behind the current choice are in ``benchmarks/results/fast-choice.json``.
"""

from __future__ import annotations

from typing import Any

from dllm.registry import preset_class
from dllm.samplers.base import Sampler, register_sampler, samplers

# (registered sampler, option defaults); compact="auto": static variant batches on CUDA (no host read);
# stats="auto": the fused vocabulary statistics on CUDA
CHOICE: tuple[str, dict[str, Any]] = ("lopa", {"branches": 3, "reuse": True, "compact": "auto", "stats": "auto"})


def preset(name: str, base_name: str, defaults: dict[str, Any], doc: str) -> type[Sampler]:
    """A subclass of sampler ``base_name`` whose Config has ``defaults`` (validated as usual)."""
    return preset_class(samplers, name, base_name, defaults, doc)


def _register_fast() -> type[Sampler]:
    base_name, defaults = CHOICE
    opts = ", ".join(f"{k}={v!r}" for k, v in defaults.items())
    spec = f"{base_name}({opts})" if opts else base_name
    cls = preset("fast", base_name, defaults, f"Recommended parallel sampler: {spec}, chosen by measurement.")
    description = f"the recommended parallel sampler = {spec}, chosen by measurement (dllm bench choose-fast)"
    return register_sampler("fast", description=description)(cls)


Fast = _register_fast()
