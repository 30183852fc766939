"""Reference transcription of Fast-dLLM v1's cached LLaDA drivers (NVlabs/Fast-dLLM ``llada/generate.py``,
later version f6b35ec): ``generate``, ``generate_with_prefix_cache``, ``generate_with_dual_cache``,
their selection routine ``get_transfer_index``, and the cache semantics of Fast-dLLM's modified LLaDA
modelling (``llada/model/modeling_llada.py``), restated from the public code. Written for
``dllm``'s tests; no code copied.

This is an *oracle*: the order of operations that can change a result is kept (float64 softmax for
the confidence, ``torch.topk`` on a full row, the threshold rule "keep rank 0, drop later ranks below
the threshold", the loop order of the later version: the block-start forward drives the first update,
the completion test comes BEFORE every cached forward, the discarded extra Gumbel call of the prefix
driver), and so are the cache semantics:

* keys/values are cached BEFORE RoPE, per layer [B, Hkv, L, hd]; every forward re-rotates the whole
  key set at positions ``0 .. key_len - 1``;
* prefix mode: the block-start cache is cut to columns ``[0, s)``; each cached forward concatenates
  it with the fresh K/V of its queries ``x[:, s:]``, whose queries are rotated at
  ``[key_len - q_len, key_len)``; the returned (longer) cache is discarded, so the prefix stays
  frozen for the whole block;
* dual mode: each cached forward of ``x[:, s:e]`` overwrites rows ``[s, e)`` of the block-start cache
  IN PLACE (the cache tensors persist across the block's steps) and attends to the full-length
  cache; queries are rotated at ``[max(replace) + 1 - q_len, max(replace) + 1)``;
* attention is ``F.scaled_dot_product_attention`` without a mask (no padding, no causal mask).

Differences from the original, inert for what is tested:

* the model is ``FastDLLMLLaDA``, a restatement of the modified LLaDA forward (LLaMA-style block:
  RMSNorm, q/k/v, RoPE in float32, attention, ``attn_out``; RMSNorm, ``ff_proj``/``up_proj`` SwiGLU,
  ``ff_out``; final RMSNorm and LM head) over the weights of a ``dllm`` LLaDA model, instead of
  ``LLaDAModelLM`` loaded from a checkpoint;
* dual mode with batch > 1 replaces the rows of the block in every batch row; the official modelling
  concatenates the replace indices of all rows and fails on a shape mismatch (NVlabs/Fast-dLLM PR #17).
  With equal-length prompts every row's block is the same columns, so this is the intended
  semantics;
* the ``factor`` mode and ``step_callback`` are omitted;
* ``forbid_mask_commit=True`` raises ``MaskCommitError`` when a committed proposal is the mask id
  (the original commits it; ``dllm`` never proposes the mask id), so equality tests can detect it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from .llada_generate import MaskCommitError

__all__ = [
    "FastDLLMLLaDA",
    "fastdllm_generate",
    "generate_with_dual_cache",
    "generate_with_prefix_cache",
    "get_transfer_index",
]


# ---------------------------------------------------------------------------------------------
# The modified LLaDA forward with Fast-dLLM's cache semantics


@dataclass
class FastDLLMOutput:
    logits: torch.Tensor  # [B, T, V]
    past_key_values: Optional[list[tuple[torch.Tensor, torch.Tensor]]]  # per layer, pre-RoPE


class FastDLLMLLaDA:
    """Fast-dLLM's LLaDA forward over the weights of a ``dllm`` LLaDA model (``model.transformer``).

    ``__call__(input_ids, past_key_values=None, use_cache=False, replace_position=None)`` as the
    HF model is called by the drivers.
    """

    def __init__(self, model) -> None:
        self.tr = model.transformer
        cfg = model.config
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.theta = cfg.rope_theta
        self.eps = cfg.rms_eps
        self.rope_full_precision = cfg.rope_fp32
        self.device = next(model.parameters()).device

    # LLaDA's RMSLayerNorm: normalise in float32, cast back, then scale by the weight.
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        og_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        x = x.to(og_dtype)
        return weight * x

    def _rotary_table(self, seq_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        dim = self.head_dim
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float) / dim))
        seq = torch.arange(seq_len, device=device, dtype=torch.float)
        freqs = torch.einsum("i , j -> i j", seq, inv_freq)
        positions = torch.cat((freqs, freqs), dim=-1)
        return positions.sin()[None, None, :, :], positions.cos()[None, None, :, :]

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        b, nh, t, hs = x.size()
        x = x.view(b, nh, t, 2, hs // 2)
        x1, x2 = x.unbind(dim=-2)
        return torch.cat((-x2, x1), dim=-1)

    def _apply_rotary(self, pos_sin, pos_cos, t):
        return ((t * pos_cos) + (self._rotate_half(t) * pos_sin)).to(t.dtype)

    def _rotary(self, q, k, block_end_index: Optional[int] = None):
        if self.rope_full_precision:
            q_, k_ = q.float(), k.float()
        else:
            q_, k_ = q, k
        query_len, key_len = q_.shape[-2], k_.shape[-2]
        pos_sin, pos_cos = self._rotary_table(key_len, q_.device)
        pos_sin, pos_cos = pos_sin.type_as(q_), pos_cos.type_as(q_)
        end = key_len if block_end_index is None else block_end_index
        q_ = self._apply_rotary(pos_sin[:, :, end - query_len:end, :], pos_cos[:, :, end - query_len:end, :], q_)
        k_ = self._apply_rotary(pos_sin, pos_cos, k_)
        return q_.type_as(q), k_.type_as(k)

    def _attention(self, layer, q, k, v, layer_past, use_cache, replace_position):
        b, t, c = q.size()
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        replace_end = None
        if layer_past is not None:
            past_key, past_value = layer_past
            if replace_position is None:
                k = torch.cat((past_key, k), dim=-2)
                v = torch.cat((past_value, v), dim=-2)
            else:
                # intended semantics of the in-place replacement (official: all rows' indices
                # concatenated, NVlabs/Fast-dLLM PR #17); the rows share the block here
                replace_indices = replace_position[0].nonzero(as_tuple=True)[0]
                past_key[:, :, replace_indices] = k
                k = past_key
                past_value[:, :, replace_indices] = v
                v = past_value
                replace_end = int(replace_indices.max()) + 1
        present = (k, v) if use_cache else None  # pre-RoPE
        q, k = self._rotary(q, k, replace_end)
        if self.n_heads != self.n_kv_heads:
            g = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(g, dim=1, output_size=self.n_heads)
            v = v.repeat_interleave(g, dim=1, output_size=self.n_heads)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
        att = att.transpose(1, 2).contiguous().view(b, t, c)
        return layer.attn.o_proj(att), present

    @torch.no_grad()
    def __call__(self, input_ids, past_key_values=None, use_cache=False, replace_position=None):
        x = self.tr.embed(input_ids)
        presents = [] if use_cache else None
        for i, layer in enumerate(self.tr.layers):
            layer_past = None if past_key_values is None else past_key_values[i]
            x_normed = self._rms(x, layer.attn_norm.weight)
            q = layer.attn.q_proj(x_normed)
            k = layer.attn.k_proj(x_normed)
            v = layer.attn.v_proj(x_normed)
            att, cache = self._attention(layer, q, k, v, layer_past, use_cache, replace_position)
            x = x + att
            og_x = x
            h = self._rms(x, layer.mlp_norm.weight)
            h, h_up = layer.mlp.gate_proj(h), layer.mlp.up_proj(h)  # ff_proj, up_proj
            h = F.silu(h)
            h = h * h_up
            h = layer.mlp.down_proj(h)  # ff_out
            x = og_x + h
            if presents is not None:
                presents.append(cache)
        x = self._rms(x, self.tr.norm.weight)
        if self.tr.lm_head is None:
            logits = F.linear(x, self.tr.embed.weight, None)
        else:
            logits = self.tr.lm_head(x)
        return FastDLLMOutput(logits=logits, past_key_values=presents)


# ---------------------------------------------------------------------------------------------
# Selection routine and drivers


def add_gumbel_noise(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Gumbel-max in float64; at T == 0 the logits themselves (no random draw)."""
    if temperature == 0:
        return logits
    logits64 = logits.to(torch.float64)
    noise = torch.rand_like(logits64, dtype=torch.float64)
    return logits64.exp() / (-torch.log(noise)) ** temperature


def get_num_transfer_tokens(mask_index: torch.Tensor, steps: int) -> torch.Tensor:
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    out = torch.zeros(mask_num.size(0), steps, device=mask_index.device, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        out[i, : remainder[i]] += 1
    return out


def get_transfer_index(logits, temperature, remasking, mask_index, x, num_transfer_tokens, threshold=None,
                       *, mask_id: Optional[int] = None):
    """x0 = argmax of the (Gumbel-perturbed) logits; confidence = float64 softmax prob of x0;
    fixed mode: per row the top ``num_transfer_tokens[j]``; threshold mode: top K (K = active
    count), keep rank 0, drop later ranks whose confidence < threshold."""
    logits_with_noise = add_gumbel_noise(logits, temperature=temperature)
    x0 = torch.argmax(logits_with_noise, dim=-1)
    if remasking == "low_confidence":
        p = F.softmax(logits.to(torch.float64), dim=-1)
        x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
    elif remasking == "random":
        x0_p = torch.rand((x0.shape[0], x0.shape[1]), device=x0.device)
    else:
        raise NotImplementedError(remasking)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -np.inf)
    transfer_index = torch.zeros_like(x0, dtype=torch.bool, device=x0.device)
    if threshold is not None:
        num_transfer_tokens = mask_index.sum(dim=1, keepdim=True)
    for j in range(confidence.shape[0]):
        _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j]))
        transfer_index[j, select_index] = True
        if threshold is not None:
            for k in range(1, int(num_transfer_tokens[j])):
                if confidence[j, select_index[k]] < threshold:
                    transfer_index[j, select_index[k]] = False
    if mask_id is not None and bool((x0[transfer_index] == mask_id).any()):
        raise MaskCommitError("Fast-dLLM reference would commit the mask id")
    return x0, transfer_index


def _canvas(model, prompt, gen_length, mask_id):
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long,
                   device=model.device)
    x[:, : prompt.shape[1]] = prompt.clone()
    return x


@torch.no_grad()
def fastdllm_generate(model, prompt, steps=128, gen_length=128, block_length=128, temperature=0.0,
                      remasking="low_confidence", mask_id=126336, threshold=None, *,
                      forbid_mask_commit=False):
    """``generate`` (no cache): full forward every step, loop until the block has no masks."""
    guard = mask_id if forbid_mask_commit else None
    x = _canvas(model, prompt, gen_length, mask_id)
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps_per_block = steps // num_blocks
    nfe = 0
    for num_block in range(num_blocks):
        start = prompt.shape[1] + num_block * block_length
        end = start + block_length
        num_transfer_tokens = get_num_transfer_tokens(x[:, start:end] == mask_id, steps_per_block)
        i = 0
        while True:
            nfe += 1
            mask_index = x == mask_id
            logits = model(x).logits
            mask_index[:, end:] = 0
            x0, transfer_index = get_transfer_index(
                logits, temperature, remasking, mask_index, x,
                num_transfer_tokens[:, i] if threshold is None else None, threshold, mask_id=guard)
            x[transfer_index] = x0[transfer_index]
            i += 1
            if (x[:, start:end] == mask_id).sum() == 0:
                break
    return x, nfe


@torch.no_grad()
def generate_with_prefix_cache(model, prompt, steps=128, gen_length=128, block_length=128, temperature=0.0,
                               remasking="low_confidence", mask_id=126336, threshold=None, *,
                               forbid_mask_commit=False, partial_last_block=False):
    """Prefix cache: block-start full forward (first update), then ``x[:, s:]`` against K/V of
    ``[0, s)`` frozen for the block. Returns ``(x, nfe)``. ``partial_last_block``: as in
    ``generate_with_dual_cache`` (not in the original)."""
    guard = mask_id if forbid_mask_commit else None
    x = _canvas(model, prompt, gen_length, mask_id)
    assert partial_last_block or gen_length % block_length == 0
    num_blocks = -(-gen_length // block_length)
    assert steps % num_blocks == 0
    steps_per_block = steps // num_blocks
    nfe = 0
    for num_block in range(num_blocks):
        start = prompt.shape[1] + num_block * block_length
        end = min(start + block_length, prompt.shape[1] + gen_length)
        num_transfer_tokens = get_num_transfer_tokens(x[:, start:end] == mask_id, steps_per_block)

        output = model(x, use_cache=True)
        past_key_values = output.past_key_values
        mask_index = x == mask_id
        mask_index[:, end:] = 0
        x0, transfer_index = get_transfer_index(
            output.logits, temperature, remasking, mask_index, x,
            num_transfer_tokens[:, 0] if threshold is None else None, threshold, mask_id=guard)
        x[transfer_index] = x0[transfer_index]

        # keep only the prefix [0, s) of every layer's cache
        past_key_values = [tuple(t[:, :, :start] for t in layer) for layer in past_key_values]
        nfe += 1
        i = 1
        while True:
            if (x[:, start:end] == mask_id).sum() == 0:
                break
            nfe += 1
            mask_index = x[:, start:] == mask_id
            mask_index[:, block_length:] = 0
            logits = model(x[:, start:], past_key_values=past_key_values, use_cache=True).logits
            _ = torch.argmax(add_gumbel_noise(logits, temperature=temperature), dim=-1)  # unused (RNG)
            x0, transfer_index = get_transfer_index(
                logits, temperature, remasking, mask_index, x[:, start:],
                num_transfer_tokens[:, i] if threshold is None else None, threshold, mask_id=guard)
            x[:, start:][transfer_index] = x0[transfer_index]
            i += 1
    return x, nfe


@torch.no_grad()
def generate_with_dual_cache(model, prompt, steps=128, gen_length=128, block_length=128, temperature=0.0,
                             remasking="low_confidence", mask_id=126336, threshold=None, *,
                             forbid_mask_commit=False, partial_last_block=False):
    """Dual cache: block-start full forward (first update), then ``x[:, s:e]`` against the whole
    cache with rows ``[s, e)`` replaced in place each step. Returns ``(x, nfe)``.

    ``partial_last_block=True`` (not in the original, which asserts ``gen_length % block_length ==
    0``) lets the last block end at ``gen_length``, as ``dllm``'s engine does; the loop is otherwise
    unchanged (used by ``benchmarks/e2e_driver.py`` on answers whose length is not a multiple of the
    block)."""
    guard = mask_id if forbid_mask_commit else None
    x = _canvas(model, prompt, gen_length, mask_id)
    assert partial_last_block or gen_length % block_length == 0
    num_blocks = -(-gen_length // block_length)
    assert steps % num_blocks == 0
    steps_per_block = steps // num_blocks
    nfe = 0
    for num_block in range(num_blocks):
        start = prompt.shape[1] + num_block * block_length
        end = min(start + block_length, prompt.shape[1] + gen_length)
        num_transfer_tokens = get_num_transfer_tokens(x[:, start:end] == mask_id, steps_per_block)

        output = model(x, use_cache=True)
        past_key_values = output.past_key_values
        mask_index = x == mask_id
        mask_index[:, end:] = 0
        x0, transfer_index = get_transfer_index(
            output.logits, temperature, remasking, mask_index, x,
            num_transfer_tokens[:, 0] if threshold is None else None, threshold, mask_id=guard)
        x[transfer_index] = x0[transfer_index]
        nfe += 1

        i = 1
        replace_position = torch.zeros_like(x, dtype=torch.bool)
        replace_position[:, start:end] = 1
        while True:
            if (x[:, start:end] == mask_id).sum() == 0:
                break
            nfe += 1
            mask_index = x[:, start:end] == mask_id
            logits = model(x[:, start:end], past_key_values=past_key_values, use_cache=True,
                           replace_position=replace_position).logits
            x0, transfer_index = get_transfer_index(
                logits, temperature, remasking, mask_index, x[:, start:end],
                num_transfer_tokens[:, i] if threshold is None else None, threshold, mask_id=guard)
            x[:, start:end][transfer_index] = x0[transfer_index]
            i += 1
    return x, nfe
