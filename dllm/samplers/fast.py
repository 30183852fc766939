"""``fast``: the recommended parallel sampler, a registered sampler chosen by measurement.

``fast`` is a preset: an existing sampler with chosen option defaults (``CHOICE``), registered under
its own name so that ``dllm.generate(model, prompt, sampler="fast")`` needs no options. Options
given by the caller still override the preset. How it was chosen (the rule, the candidates and
the numbers) is in ``dllm.eval.choose_fast`` and in ``MEASUREMENT`` below; re-run

    python -m dllm.eval.choose_fast --models tiny-llada tiny-dream --n 8 --threads 1

when the embedded models change.

History. 2026-11-30, first embedded models (~40% on the stress suite): no published sampler
passed, and ``spec_threshold`` (0.9) did: ``threshold``'s exact tokens with drafts verified in one
batched forward. Same day, retrained models (~70%): no published sampler passed, and
``spec_threshold`` (0.9) missed by 0.2 pt on tiny-llada because ``threshold`` 0.9 itself is 1.2 pt
below one token per step there. At threshold 0.95 ``spec_threshold`` equals one token per step in
accuracy on both models, with more tokens per forward than ``threshold`` 0.9
(``benchmarks/fast-choice-2026-11-30.json``). It forwards ~2x more tokens than ``threshold``
(B x N verification canvases): fewer forwards, not less arithmetic. It also runs under the
``prefix``/``dual``/``window`` caches, where it equals ``threshold`` 0.95 with the same cache.
Same day, models with the focus phases (~90% / 85%): ``spec_threshold`` at 0.9, 0.95 and 0.99
all pass, no published sampler does; 0.9 has the highest mean TPF (2.16 vs 2.12 and 2.03), so
``fast`` is ``spec_threshold`` with its default threshold 0.9 again; it equals ``threshold`` 0.9
token for token (with or without a cache).
"""

from __future__ import annotations

from dataclasses import field, fields, make_dataclass
from typing import Any

from dllm.samplers.base import Sampler, register_sampler, samplers

CHOICE: tuple[str, dict[str, Any]] = ("spec_threshold", {})
MEASUREMENT = ("2026-11-30, full stress suite x 8, models with the focus phases: tiny-llada 89.5% at 2.19 "
               "TPF vs threshold 0.9 89.5% at 1.93 and low_confidence 90.3%; tiny-dream 84.3% at 2.13 vs "
               "threshold 0.9 84.3% at 1.89 and low_confidence 84.7%; the candidate with the highest TPF "
               "passing on both models")


def preset(name: str, base_name: str, defaults: dict[str, Any], doc: str) -> type[Sampler]:
    """A subclass of sampler ``base_name`` whose Config has ``defaults`` (validated as usual)."""
    base = samplers.get(base_name)
    known = {f.name for f in fields(base.Config)}
    unknown = sorted(set(defaults) - known)
    if unknown:
        raise ValueError(f"preset {name!r}: {base_name!r} has no options {unknown} (valid: {sorted(known)})")
    config = make_dataclass(f"{name.title()}Config", [(k, type(v), field(default=v)) for k, v in defaults.items()],
                            bases=(base.Config,), frozen=True)
    config()  # the preset's own defaults must pass the base's checks
    return type(name.title(), (base,), {"Config": config, "__doc__": doc})


def _register_fast() -> type[Sampler]:
    base_name, defaults = CHOICE
    opts = ", ".join(f"{k}={v!r}" for k, v in defaults.items())
    spec = f"{base_name}({opts})" if opts else base_name
    cls = preset("fast", base_name, defaults, f"Recommended parallel sampler: {spec}, chosen by measurement.")
    return register_sampler("fast", description=f"the recommended parallel sampler = {spec} ({MEASUREMENT})")(cls)


Fast = _register_fast()
