"""Exact-match scoring of a model on the stress tasks, below ``eval`` and ``train`` (both use it).

- ``setting``: ``DecodeSetting``, one decode setting (sampler spec + cache + k tokens per step +
  block length), parsed once from ``"sampler:opt=v,k=2,cache=(dual:look_back=16,look_ahead=16)"``;
- ``exact_match``: the one decode-and-score loop (``decode_and_score``), the test-split sampling
  (``eval_examples``) and training's evaluation (``evaluate``, ``EvalResult``, the C(Y|X) = 0 tasks).
"""
