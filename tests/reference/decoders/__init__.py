"""Test-side reference implementations of the official samplers.

These modules re-state, step by step, the public reference sampling loops that the project's
engine must reproduce token for token:

* :mod:`.llada_generate` -- ML-GSAI/LLaDA ``generate.py`` ``generate()`` at HEAD (commit 65cbed2),
  including its quirks (bug ML-GSAI/LLaDA#137 at T > 0, optional fix).
* :mod:`.dream_generate` -- Dream ``generation_utils.py`` ``_sample`` / ``sample_tokens``
  (``diffusion_generate``), algorithms ``origin``, ``maskgit_plus``, ``topk_margin``, ``entropy``.
* :mod:`.fastdllm_generate` -- NVlabs/Fast-dLLM ``llada/generate.py`` (no cache, prefix and dual
  cache drivers) with the cache semantics of its LLaDA modelling.
* :mod:`.fastdllm_dream_generate` -- NVlabs/Fast-dLLM ``dream/model/generation_utils.py``,
  ``alg='confidence_threshold'`` (the threshold rule capped by the step schedule).
* :mod:`.klass_generate` -- shkim0116/KLASS ``src/model/llada_klass.py``
  ``stable_confident_decode`` (KL-stability decoding over semi-autoregressive blocks).
* :mod:`.wino_generate` -- Feng-Hong/WINO-DLLM ``LLaDA/decoding.py`` ``decoding_wino``.
* :mod:`.hierarchy_generate` -- inclusionAI/dInfer ``HierarchyDecoder`` and its block loops
  (``BlockWiseDiffusionLLM``, ``BlockDiffusionLLMAttnmask``), which :mod:`.credit_generate` reuses with
  ``CreditThresholdParallelDecoder``.
* :mod:`.prophet_generate` -- pixeli99/Prophet ``generate_earlyexit.py`` ``generate``.
* :mod:`.localleap_generate` -- lizhuo-luo/DAWN's LocalLeap (``llada/generate.py``, Dream's
  ``_sample_block``); :mod:`.dus_generate` -- omerlux/DUS ``generate_scheduled`` (``dilated``).
* :mod:`.dawn_generate` -- lizhuo-luo/DAWN's dependency-aware loops (LLaDA ``generate(dawn=True)``,
  Dream ``_sample_block(alg='dawn')``); :mod:`.fastdllm_factor` -- NVlabs/Fast-dLLM's factor mode
  (``get_transfer_index_dynamic``) and its drivers.
* and the others in this folder, each citing its source in its docstring.

They are written against a plain ``model_fn`` callable instead of a Hugging Face model so they can
be driven by toy functions (``tests/reference/test_transcripts_*.py``) and by ``dllm``'s tiny models
(``tests/samplers/test_reference_{equality,ties}.py``).  They live under ``tests/`` on purpose: they are
oracles, not library code, and must stay literal transcriptions (no speed-ups, no clean-ups that
change the random-number stream or the floating-point operations).
"""

from .dream_generate import dream_generate, dream_sample_tokens
from .llada_generate import (
    AmbiguousTieError,
    MaskCommitError,
    ambiguous_topk,
    llada_generate,
    llada_transfer_schedule,
)

__all__ = [
    "AmbiguousTieError",
    "MaskCommitError",
    "ambiguous_topk",
    "dream_generate",
    "dream_sample_tokens",
    "llada_generate",
    "llada_transfer_schedule",
]
