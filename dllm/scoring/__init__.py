"""Exact-match scoring of a model on the stress tasks, below ``eval`` and ``train`` (both use it).

- ``exact_match``: the one decode-and-score loop (``decode_and_score``, decoding with one
  ``dllm.settings.DecodeSettings``), the test-split sampling (``eval_examples``) and training's
  evaluation (``evaluate``, ``EvalResult``, the C(Y|X) = 0 tasks).
"""
