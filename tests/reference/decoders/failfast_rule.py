"""Reference transcription of FailFast's dynamic draft length (Pan et al., arXiv 2512.20573, Alg. 1),
restated from the authors' drafting function ``generate_draft_tokens_arbitrary_length`` (their fork
of Efficient-Large-Model/Fast_dLLM_v2_1.5B, called by ``failfast.py`` ``get_next_tokens_dllm`` in
github.com/ruipeterpan/failfast with ``--spec_len 10 --sweep_incr_len 10 --sweep_max_spec_len 60
--sweep_lowconf_threshold 0.45 --drafter_thresholds 0.05``), with its optional extras off
(``frontier_stop_mode`` disabled, no ``--reuse_drafts``); no code copied. One row, greedy, as there.

The drafter decodes ``unit`` positions at a time (upstream: a Fast-dLLM v2 small block of 8 inside a
32-token block; ``dllm``'s ``failfast`` decodes one chunk per forward, i.e. ``unit`` = the chunk):

* per forward over the current unit (``step_logits(prefix, unit_tokens)``: logits [n, V] of the
  unit's n positions given the drafted prefix and the unit as it stands, ``MASK`` where a position is
  not committed yet; upstream's Fast-dLLM v2 forward also shows the masks up to its 32-token block
  boundary, and at that boundary runs one more forward to update its cache, which appends one
  arg-max token: both belong to that modelling and are not transcribed): Fast-dLLM's
  ``sample_with_top_p`` at temperature 0 is (arg-max, softmax); the probability of the arg-max of
  every still-masked position of the unit is appended to ``conf_of_unmasked_tokens``; every masked
  position with ``p > threshold`` is committed, and always the most confident one;
* before each forward: a stop token already drafted with no mask before it ends the round;
* after each forward, once the positions ``[0, spec_len)`` hold no mask: if any recorded confidence
  is ``< lowconf_threshold`` the round ends (fail fast); elif ``len(conf_of_unmasked_tokens) >=
  max_spec_len`` it ends (its cap); else ``spec_len += incr_len`` (win big) and decoding goes on;
* the proposal is the first ``spec_len`` drafted tokens, cut after the first stop token; the verifier
  then checks all of them.

Returns (proposal, spec_len, forwards).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

MASK = -1  # a committed position never holds it


def failfast_round(step_logits: Callable[[list[int], list[int]], torch.Tensor], *, spec_len: int = 10,
                   incr_len: int = 10, max_spec_len: int = 60, lowconf_threshold: float = 0.45,
                   threshold: float = 0.05, unit: Optional[int] = None,
                   stop_token: Optional[int] = None) -> tuple[list[int], int, int]:
    unit = incr_len if unit is None else unit
    canvas: list[int] = []  # the drafted positions, MASK where not committed yet
    conf_of_unmasked_tokens: list[float] = []
    forwards = 0
    while True:  # one decode unit after another
        start = len(canvas)
        canvas += [MASK] * unit
        while MASK in canvas[start:]:
            if stop_token is not None and stop_token in canvas:
                idx = canvas.index(stop_token)
                if MASK not in canvas[:idx]:
                    return _proposal(canvas, spec_len, stop_token), spec_len, forwards
            logits = step_logits(canvas[:start], canvas[start:])  # [unit, V]
            probs = torch.softmax(logits.float(), dim=-1)
            forwards += 1
            x1 = probs.argmax(dim=-1).tolist()
            p1 = probs.max(dim=-1).values.tolist()
            masked = [i for i in range(unit) if canvas[start + i] == MASK]
            conf_of_unmasked_tokens += [p1[i] for i in masked]
            best = max(masked, key=lambda i: p1[i])
            for i in masked:
                if p1[i] > threshold or i == best:
                    canvas[start + i] = x1[i]
            if spec_len <= len(canvas) and MASK not in canvas[:spec_len]:
                if any(c < lowconf_threshold for c in conf_of_unmasked_tokens):
                    return _proposal(canvas, spec_len, stop_token), spec_len, forwards
                if len(conf_of_unmasked_tokens) >= max_spec_len:
                    return _proposal(canvas, spec_len, stop_token), spec_len, forwards
                spec_len += incr_len


def _proposal(canvas: list[int], spec_len: int, stop_token: Optional[int]) -> list[int]:
    out = canvas[:spec_len]
    if stop_token is not None and stop_token in out:
        out = out[:out.index(stop_token) + 1]
    return out
