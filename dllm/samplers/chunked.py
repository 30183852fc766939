"""The references' float64 statistics in row chunks: the same bits, bounded memory.

LLaDA's ``generate`` and Fast-dLLM's drivers perturb and normalise logits in float64 over whole
tensors: ``softmax(logits.to(float64))`` over every forwarded row, and the Gumbel-max uniforms
``rand_like(float64 logits)`` over the whole canvas (ML-GSAI/LLaDA ``generate.py``
``add_gumbel_noise``). With LLaDA-8B's 126,464-word vocabulary and a 1,056-column canvas that is a
1 GiB float64 temporary per step (each), for statistics a step reads at a few dozen positions.

Both are row-wise, so they can run a few rows at a time with identical results:

- a softmax over the last dimension treats each row alone: chunks of rows give the same bits;
- CPU generators (mt19937) emit one value per element in order, so drawing the flattened tensor
  in consecutive pieces gives the same stream as one draw (tested). CUDA's Philox generator
  advances its offset per launch, so there the chunked draw would change the stream: on CUDA the
  uniforms are drawn in one piece, as the reference does (``stream_chunkable``).

Rows not read are still drawn (and thrown away) where the reference draws them, so a seed gives
the reference's tokens; nothing of size [B, L, V] in float64 is allocated on CPU.
``CHUNK_ELEMENTS`` bounds a temporary (elements; 2^22 float64 = 32 MiB); tests lower it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from dllm.samplers.draws import Generator, RowGenerators, WindowRows

CHUNK_ELEMENTS: int = 1 << 22


def rows_per_chunk(vocab: int, chunk_elements: Optional[int] = None) -> int:
    """Rows of ``vocab`` values per temporary, at least one."""
    budget = CHUNK_ELEMENTS if chunk_elements is None else chunk_elements
    return max(1, budget // max(1, vocab))


def stream_chunkable(device: torch.device) -> bool:
    """Whether uniforms drawn in pieces on ``device`` reproduce one draw (CPU generators only)."""
    return device.type == "cpu"


def pick_last(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[..., index]`` per position: values [..., V], index [...] long -> [...]: one ``gather``
    (and two views; on a CPU about half the host time of the equivalent advanced indexing)."""
    return values.gather(-1, index.unsqueeze(-1)).squeeze(-1)


def softmax_prob(logits: torch.Tensor, tokens: torch.Tensor, chunk_elements: Optional[int] = None,
                 dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``softmax(logits.to(dtype), -1)`` gathered at ``tokens``, a chunk of rows at a time.

    logits [..., V], tokens [...] long -> [...] ``dtype`` (float64 as LLaDA and Fast-dLLM's LLaDA
    drivers; the logits' own dtype as Dream's ``sample_tokens``), bit-equal to the one-piece
    computation.
    """
    v = logits.shape[-1]
    step = rows_per_chunk(v, chunk_elements)
    if logits.numel() <= step * v:  # one piece: the cast rides in the softmax call (the same bits)
        return pick_last(torch.softmax(logits, dim=-1, dtype=dtype), tokens)
    flat = logits.reshape(-1, v)  # [N, V]
    idx = tokens.reshape(-1, 1)  # [N, 1]
    out = torch.cat([torch.softmax(part, dim=-1, dtype=dtype).gather(-1, i)
                     for part, i in zip(flat.split(step), idx.split(step))])
    return out.reshape(tokens.shape)


_CONSTANTS: dict[tuple, Any] = {}  # constant()'s tensors by key and inference mode


def constant(key: tuple, make: Callable[[], Any]) -> Any:
    """``make()`` once per ``key`` (which names the device), kept: a sampler's constant tensors (one
    made under ``torch.inference_mode`` serves only there: autograd cannot save an inference tensor)."""
    full = (*key, torch.is_inference_mode_enabled())
    made = _CONSTANTS.get(full)
    if made is None:
        if len(_CONSTANTS) >= 128:
            _CONSTANTS.clear()
        made = _CONSTANTS[full] = make()
    return made


def column_ids(n: int, device: torch.device) -> torch.Tensor:
    """``arange(n)`` long on ``device`` [n], made once per (n, device) (``constant``)."""
    return constant(("column ids", n, device), lambda: torch.arange(n, device=device))


def banned_column(v: int, banned: int, device: torch.device) -> torch.Tensor:
    """bool [V], True at ``banned`` only; made once per (V, id, device) (``constant``)."""
    def make() -> torch.Tensor:
        mask = torch.zeros(v, dtype=torch.bool, device=device)
        mask[banned] = True
        return mask
    return constant(("banned column", v, banned, device), make)


def neg_inf(device: torch.device) -> torch.Tensor:
    """-inf as a 0-dim float32 tensor on ``device``, made once (``constant``): ``torch.where(m, x,
    neg_inf(d))`` is ``torch.where(m, x, float("-inf"))`` in x's dtype without wrapping the Python
    scalar into a tensor at every call (a third of a small ``where``'s host time on a CPU)."""
    return constant(("-inf", device), lambda: torch.full((), float("-inf"), device=device))


def without_column(z: torch.Tensor, banned: int) -> torch.Tensor:
    """A copy of z [..., V] with column ``banned`` (0 <= banned < V) at -inf: one ``where`` call
    (``masked_fill`` out of place is a copy and a fill, two)."""
    cols, inf = constant(("banned column, -inf", z.shape[-1], banned, z.device),
                         lambda: (banned_column(z.shape[-1], banned, z.device), neg_inf(z.device)))
    return torch.where(cols, inf, z)


def argmax_excluding(z: torch.Tensor, banned: int, keepdim: bool = False) -> torch.Tensor:
    """``argmax(z, -1)``, except that the ``banned`` id (the mask token) is never returned.

    Where the arg-max is ``banned`` the runner-up is taken (the first index among equal runners-up);
    elsewhere the result is exactly ``z.argmax(-1)`` (the first index of the maximum, as the
    references): the arg-max of z with ``banned``'s column at -inf, two calls (a copy of z, then
    ``argmax``; a row of -inf gives index 0, the lowest id that is not ``banned`` unless it is 0,
    taken apart). The same index as comparing the maxima of the two sides of ``banned`` for every z
    without NaN. z: [..., V] float -> [...] long ([..., 1] with ``keepdim``, ready for a gather).
    """
    v = z.shape[-1]
    if v < 2:
        raise ValueError(f"argmax_excluding needs at least 2 ids to choose from, got V = {v}")
    if not 0 <= banned < v:  # not an id of this vocabulary: nothing to exclude
        return z.argmax(dim=-1, keepdim=keepdim)
    if banned == 0:  # a row of -inf would give index 0 back
        return z[..., 1:].argmax(dim=-1, keepdim=keepdim) + 1
    return without_column(z, banned).argmax(dim=-1, keepdim=keepdim)


def max_prob_excluding(logits: torch.Tensor, banned: Optional[int],
                       dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``softmax(logits)`` (in ``dtype``; None: the logits') at ``argmax_excluding(logits, banned)``,
    as the largest probability with ``banned``'s column at -inf: the softmax is monotone in the
    logits, so its maximum is its value at the arg-max, whichever of equal maxima the arg-max takes.
    Two calls (three with a column to exclude) instead of the arg-max and a gather; the whole
    [..., V] softmax at once (callers over ``CHUNK_ELEMENTS`` take the chunked gather instead).
    banned: an id never proposed (the mask token), or None. [..., V] -> [...]."""
    return max_excluding(torch.softmax(logits, dim=-1, dtype=dtype), banned)  # [..., V] -> [...]


def max_excluding(values: torch.Tensor, banned: Optional[int]) -> torch.Tensor:
    """The largest of values [..., V] without column ``banned`` (None, or not an id of V: every
    column) -> [...]: ``where`` and ``amax``, one call fewer than an arg-max and its gather. The
    maximum of a monotone function of logits (their softmax) is its value at the logits' arg-max,
    so it is ``p(argmax_excluding(logits, banned))`` exactly."""
    return _excluded(values, banned).amax(dim=-1)


def _excluded(values: torch.Tensor, banned: Optional[int]) -> torch.Tensor:
    """values [..., V] with column ``banned`` at -inf (``without_column``), or values itself where
    ``banned`` is None or not an id of V."""
    return without_column(values, banned) if banned is not None and 0 <= banned < values.shape[-1] else values


def greedy_with_prob(logits: torch.Tensor, banned: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(argmax_excluding(logits, banned), p)`` with p its probability under the float64 softmax of
    all of logits [..., V] (``banned``'s column in the denominator): three calls (softmax, ``where``,
    ``max``) instead of five (``where`` and ``argmax`` for the token, softmax, ``where`` and ``amax``
    for p). The float64 softmax is increasing in the logits, so its first maximum without ``banned``
    is the logits' own, and strictly so for float32/float16/bfloat16 logits: two of them give the
    same float64 ``exp(l - max)`` only if they differ by less than 2^-53 near a row maximum under
    2^-29 in magnitude, or both underflow, more than 745 below the maximum. So the one exception: a
    ``banned`` id more than 745 above every other id gives them all p = 0 (as the gather does), and
    the token is then the first of them, not their arg-max (tested). A second: a row with a +inf or
    NaN logit has an all-NaN softmax, and its token is then the lowest allowed id, where
    ``argmax_excluding`` and the fused ``vocab_stats`` give the first +inf / NaN (a broken model's
    logits; detecting them would add calls to every step). One piece of [..., V] float64 (callers
    check ``rows_per_chunk``). -> (x0 [...] long, p [...] float64)."""
    return greedy_of_probs(torch.softmax(logits, dim=-1, dtype=torch.float64), banned)


def greedy_of_probs(probs: torch.Tensor, banned: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``greedy_with_prob`` on a float64 softmax already made (``probs`` [..., V], of float32, float16 or
    bfloat16 logits, left as it is): ``where`` and ``max``, two calls. -> (x0 [...] long, p [...])."""
    if probs.dtype != torch.float64:
        raise ValueError(f"greedy_of_probs reads the arg-max off a float64 softmax, got {probs.dtype}")
    p, x0 = _excluded(probs, banned).max(dim=-1)  # the first index of the maximum, as argmax
    return x0, p


def _perturb(l64: torch.Tensor, u: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.exp(l64) / (-torch.log(u)) ** temperature  # LLaDA's exp(l) / (-log u)^T


def gumbel_argmax(logits: torch.Tensor, temperature: float, generator: Generator, mask_id: int,
                  chunk_elements: Optional[int] = None, query_start: Optional[int] = None) -> torch.Tensor:
    """LLaDA's float64 Gumbel-max sample (T > 0) on uniforms of the logits' shape, never ``mask_id``:
    logits [..., V] -> [...] long; equal to drawing ``rand(logits.shape, float64)`` at once.
    Per-row generators (``dllm.samplers.draws``): logits [B, Q, V], row r drawn alone from its
    generator, without its padding columns when ``query_start`` (the query's canvas column) is given
    (those columns get the arg-max)."""
    assert temperature > 0, "gumbel_argmax draws; at T = 0 take the arg-max"
    if isinstance(generator, RowGenerators):
        generator.check_rows(logits.shape[0], f"logits of shape {tuple(logits.shape)}")
        out = []
        for r, g in enumerate(generator.streams()):
            if g is None:  # a row that draws nothing at this step: the arg-max, as its padding columns get
                out.append(argmax_excluding(logits[r:r + 1], mask_id))
                continue
            c = generator.cut(r, query_start) if logits.dim() > 2 else 0
            row = gumbel_argmax(logits[r:r + 1, c:], temperature, g, mask_id, chunk_elements)  # [1, Q - c]
            out.append(torch.cat([argmax_excluding(logits[r:r + 1, :c], mask_id), row], dim=1) if c else row)
        return torch.cat(out)
    v = logits.shape[-1]
    flat = logits.reshape(-1, v)  # [N, V]
    step = rows_per_chunk(v, chunk_elements)
    if flat.shape[0] <= step or not stream_chunkable(logits.device):
        u = torch.rand(flat.shape, dtype=torch.float64, generator=generator, device=logits.device)
        x0 = argmax_excluding(_perturb(flat.to(torch.float64), u, temperature), mask_id)
    else:
        x0 = torch.cat([
            argmax_excluding(_perturb(part.to(torch.float64), torch.rand(
                part.shape, dtype=torch.float64, generator=generator, device=logits.device), temperature), mask_id)
            for part in flat.split(step)])
    return x0.reshape(logits.shape[:-1])


def columns_gumbel_argmax(logits: torch.Tensor, temperature: float, generator: Generator, mask_id: int,
                          length: int, start: int, chunk_elements: Optional[int] = None) -> torch.Tensor:
    """``gumbel_argmax`` of logits [B, W, V] on the columns ``[start, start + W)`` of uniforms drawn over
    [B, length, V] at once (a reference's ``rand_like`` over its whole canvas) -> [B, W] long, never
    ``mask_id``. On CPU the other columns are drawn in pieces and dropped and the window's are drawn a
    chunk of rows at a time, so no [B, W, V] float64 tensor is made (W may be most of the canvas); on
    CUDA (``stream_chunkable``) ``window_uniforms``' whole draw. Per-row generators: row r draws over its
    own canvas alone (without its left padding), and the window's columns in its padding take the arg-max
    (never read: padding is never a mask); a running decode's rows (``WindowRows``) draw over their own
    window only, so a sampler that draws so does not join one."""
    b, w, v = logits.shape
    assert 0 <= start and start + w <= length, (start, w, length)
    if isinstance(generator, WindowRows):
        raise ValueError("a running decode's rows draw over their own window: a draw over the canvas has no "
                         "place there (samplers that draw so do not join a running decode)")
    if isinstance(generator, RowGenerators):
        generator.check_rows(b, f"logits of shape {tuple(logits.shape)}")
        out = []
        for r, g in enumerate(generator.streams()):
            p = generator.pads[r]
            c = min(max(p - start, 0), w)  # columns of the window in the row's padding
            row = argmax_excluding(logits[r:r + 1], mask_id)  # [1, W]
            if g is not None and c < w:
                row[:, c:] = columns_gumbel_argmax(logits[r:r + 1, c:], temperature, g, mask_id, length - p,
                                                   start + c - p, chunk_elements)
            out.append(row)
        return torch.cat(out)  # [B, W]
    if not stream_chunkable(logits.device):
        u = window_uniforms((b, length, v), (start, start + w), generator, logits.device)  # [B, W, V]
        return argmax_excluding(_perturb(logits.to(torch.float64), u, temperature), mask_id)
    step = rows_per_chunk(v, chunk_elements) * v
    rows = []
    for r in range(b):  # the stream is row-major: [row 0: before, window, after][row 1: ...]
        _skip(start * v, generator, logits.device, step)
        rows.append(gumbel_argmax(logits[r], temperature, generator, mask_id, chunk_elements))  # [W], in chunks
        _skip((length - start - w) * v, generator, logits.device, step)
    return torch.stack(rows)  # [B, W]


def _skip(count: int, generator: Optional[torch.Generator], device: torch.device, step: int) -> None:
    """Advance the stream by ``count`` float64 uniforms, at most ``step`` values at a time."""
    for start in range(0, count, step):
        torch.rand((min(step, count - start),), dtype=torch.float64, generator=generator, device=device)


def window_uniforms(shape: torch.Size, window: tuple[int, int], generator: Generator,
                    device: torch.device, chunk_elements: Optional[int] = None,
                    query_start: int = 0) -> torch.Tensor:
    """The columns ``[ws, we)`` of ``rand(shape, float64)`` for shape [B, Q, V], as [B, W, V].

    On CPU the other columns are drawn in pieces and dropped (same stream, no [B, Q, V] tensor);
    on CUDA (``stream_chunkable``) the whole tensor is drawn, then sliced. Per-row generators: row r
    draws its own query alone (without the padding columns left of ``query_start``'s row start).
    """
    b, q, v = shape
    ws, we = window
    if isinstance(generator, WindowRows):  # a running decode's rows: each the block of its own query
        generator.check_rows(b, f"uniforms of shape {tuple(shape)}")
        if (ws, we) != (0, q) or q != generator.window:
            raise ValueError(f"a running decode's uniforms are its window's: {window} of a query of {q} columns")
        out = torch.full((b, q, v), 0.5, dtype=torch.float64, device=device)
        for r, g in enumerate(generator.streams()):
            if g is None:  # draws nothing at this step
                continue
            length, a, e = generator.queries[r]
            out[r, q - (e - a):] = window_uniforms((1, length, v), (a, e), g, device, chunk_elements)[0]
        return out
    if isinstance(generator, RowGenerators):
        generator.check_rows(b, f"uniforms of shape {tuple(shape)}")
        rows = []
        for r, g in enumerate(generator.streams()):
            if g is None:  # draws nothing at this step
                rows.append(torch.full((1, we - ws, v), 0.5, dtype=torch.float64, device=device))
                continue
            c = generator.cut(r, query_start)  # <= ws: the block is never in the padding
            rows.append(window_uniforms((1, q - c, v), (ws - c, we - c), g, device, chunk_elements))
        return torch.cat(rows)  # [B, W, V]
    if not stream_chunkable(device) or (ws == 0 and we == q):
        return torch.rand(tuple(shape), dtype=torch.float64, generator=generator, device=device)[:, ws:we]
    step = rows_per_chunk(v, chunk_elements) * v
    rows = []
    for _ in range(b):  # the stream is row-major: [row 0: before, window, after][row 1: ...]
        _skip(ws * v, generator, device, step)
        rows.append(torch.rand((we - ws, v), dtype=torch.float64, generator=generator, device=device))
        _skip((q - we) * v, generator, device, step)
    return torch.stack(rows)  # [B, W, V]


__all__ = ["CHUNK_ELEMENTS", "argmax_excluding", "banned_column", "column_ids", "columns_gumbel_argmax", "greedy_of_probs", "greedy_with_prob", "gumbel_argmax",
           "max_prob_excluding", "neg_inf", "pick_last", "rows_per_chunk", "softmax_prob", "stream_chunkable", "window_uniforms",
           "without_column"]
