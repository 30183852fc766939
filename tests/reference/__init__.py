"""Test-side transcriptions of published code, the oracles the project's tests compare against.

* :mod:`.decoders` -- the official generation loops (``*_generate.py``: LLaDA, Dream, Fast-dLLM, KLASS,
  WINO, APD, SDAR, LLaDA 2.x, Fast-dLLM v2 ...), step by step.
* :mod:`.modelling` -- the official model files that cannot be imported on a CPU machine
  (``*_modeling.py``: SDAR, LLaDA 2.x MoE, Fast-dLLM v2), restated forward by forward.

``test_transcripts_llada.py`` and ``test_transcripts_dream.py`` check the decoders on toy model
functions (``toy.py``). The benchmark drivers that time Fast-dLLM's transcribed driver against the
engine live in ``benchmarks/`` (``e2e_driver.py``, ``frontier_driver.py``, ``step_overhead.py``).
"""
