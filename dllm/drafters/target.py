"""The autoregressive target as the speculative loop sees it: checks, one forward, cache surgery.

``Target`` wraps any transformers causal LM (``AutoModelForCausalLM``: Qwen3, Qwen2, Llama, ...):
its forward takes left-padded or holed rows through a 2-D attention mask over the cache slots plus
explicit position ids, and returns float logits and, when a drafter taps layers, the concatenated
hidden states. The KV cache is the model's own ``transformers.DynamicCache``.

One cache for the whole batch, with holes (the batching design of ``loop.py``): every row writes its
block into the same slots; after verification a row's rejected slots stay in the cache but are
masked out for good, and the cache is cropped to the longest row's advance. Cache helpers here:
``crop_to`` (roll back), ``select_rows`` (drop finished rows) and ``compact`` (gather every row's
valid slots to the right, dropping columns that are holes in every row).
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
import torch.nn as nn

from dllm.drafters.base import TargetInfo


def _text_config(model) -> Any:
    config = model.config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _eos_ids(model, eos_token_id) -> tuple[int, ...]:
    """The call's EOS ids: the argument, else the generation config's, else the model config's."""
    if eos_token_id is None:
        gen_cfg = getattr(model, "generation_config", None)
        eos_token_id = getattr(gen_cfg, "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(_text_config(model), "eos_token_id", None)
    if eos_token_id is None:
        return ()
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"eos_token_id must be a token id or a list of token ids, got {eos_token_id!r}")
    return tuple(ids)


class Target:
    """A transformers causal LM checked for the speculative loop (see the module docstring)."""

    def __init__(self, model, *, taps: tuple[int, ...] = (), eos_token_id=None, tokenizer=None) -> None:
        if hasattr(model, "mask_id") and hasattr(model, "logit_shift"):
            raise TypeError(f"target is a dllm {type(model).__name__} (a masked diffusion model); the target "
                            f"must be an autoregressive transformers model (AutoModelForCausalLM). A diffusion "
                            f"model can serve as the drafter instead: drafter='dlm' with model=...")
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config") or not callable(model):
            raise TypeError(f"target must be a transformers causal LM (e.g. AutoModelForCausalLM, "
                            f"Qwen3ForCausalLM), got {type(model).__name__}")
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None
        if self.cache_kw is None:
            raise ValueError(f"target {type(model).__name__}.forward takes no KV cache (neither `cache` nor "
                             f"`past_key_values`); speculative decoding needs a cache it can crop")
        self.keep_kw = "logits_to_keep" in params  # prefill computes the LM head at the last position only
        self.model = model
        self.taps = tuple(taps)
        cfg = _text_config(model)
        self.device = next(model.parameters()).device
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        vocab = int(getattr(cfg, "vocab_size", 0) or (emb.num_embeddings if emb is not None else 0))
        eos = _eos_ids(model, eos_token_id)
        gen_cfg = getattr(model, "generation_config", None)
        pad = getattr(gen_cfg, "pad_token_id", None)
        pad = getattr(cfg, "pad_token_id", None) if pad is None else pad
        pad = (eos[0] if eos else 0) if pad is None else (pad if isinstance(pad, int) else pad[0])
        self.info = TargetInfo(
            vocab_size=vocab, num_layers=int(getattr(cfg, "num_hidden_layers", 0)),
            hidden_size=int(getattr(cfg, "hidden_size", 0)), eos_ids=eos, pad_id=int(pad),
            model_type=str(getattr(cfg, "model_type", "")), tokenizer=tokenizer,
        )

    # ---- the cache -------------------------------------------------------------------------------
    def check_tree(self, what: str = "a draft tree") -> None:
        """ValueError when the target cannot verify a draft tree: its sliding-window layers keep a window
        of cache slots, which a tree's 4-D mask over every slot does not fit (transformers raised a size
        mismatch), and the slots of a tree's rejected nodes would count in the window."""
        from transformers import DynamicCache

        try:
            from transformers.cache_utils import DynamicSlidingWindowLayer as sliding_cls
        except ImportError:  # pragma: no cover - older transformers
            return
        try:
            layers = getattr(DynamicCache(config=self.model.config), "layers", None) or ()
        except TypeError:  # transformers < 4.56: no config argument, every layer full attention
            return
        if any(type(layer) is sliding_cls for layer in layers):
            raise ValueError(f"target {type(self.model).__name__} has sliding-window layers, which cannot verify "
                             f"{what} (a tree's mask spans every cache slot; a window counts slots); use a "
                             f"chain plan (an int block size, plan=8) with this target")

    def new_cache(self, batch_size: int):
        """A fresh ``DynamicCache`` for the model; ValueError when one of its layers cannot be cropped
        back exactly (recurrent / linear-attention / quantized layers), or holds a sliding window in a
        batch (slot-based windows would count another row's holes)."""
        from transformers import DynamicCache

        try:
            cache = DynamicCache(config=self.model.config)
        except TypeError:  # transformers < 4.56: no config argument, every layer full attention
            cache = DynamicCache()
        layers = getattr(cache, "layers", None)
        if layers is None:
            return cache
        from transformers.cache_utils import DynamicLayer

        try:
            from transformers.cache_utils import DynamicSlidingWindowLayer as sliding_cls
        except ImportError:  # pragma: no cover - older transformers
            sliding_cls = ()
        kinds = [type(layer) for layer in layers]
        bad = sorted({k.__name__ for k in kinds if k is not DynamicLayer and not (sliding_cls and k is sliding_cls)})
        if bad:
            raise ValueError(f"target {type(self.model).__name__} uses cache layers {bad} that cannot be cropped "
                             f"back after a rejection (only full-attention DynamicLayer caches can, and sliding "
                             f"windows at batch size 1); speculative decoding needs a croppable KV cache")
        if sliding_cls and any(k is sliding_cls for k in kinds):
            if batch_size > 1:
                raise ValueError(f"target {type(self.model).__name__} has sliding-window layers; their window is "
                                 f"counted in cache slots, which the batched loop leaves holes in. Run it with one "
                                 f"prompt at a time (got {batch_size})")
            cache.activate_past_recording()  # keep states past the window until the round's crop
        return cache

    # ---- forward ---------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor, cache, *,
                last_only: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """input_ids [R, T] at ``positions`` [R, T], appended to ``cache``; attention_mask [R, S + T]
        bool over the cache slots then the new tokens (False = a pad or a hole), causal inside the new
        tokens; or [R, 1, T, S + T] bool (True = attend) for any other pattern (draft trees). Returns (logits
        [R, T, V] (``[R, 1, V]`` with ``last_only``), hidden [R, T, len(taps) * D] or None)."""
        kwargs: dict[str, Any] = {self.cache_kw: cache, "use_cache": True}
        if last_only and self.keep_kw:
            kwargs["logits_to_keep"] = 1
        if self.taps:
            kwargs["output_hidden_states"] = True
        mask = attention_mask if attention_mask.dim() == 4 else attention_mask.long()  # 4-D: bool, True = attend
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, **kwargs)
        logits = out.logits[:, -1:] if last_only else out.logits
        hidden = None
        if self.taps:
            states = getattr(out, "hidden_states", None)
            if states is None or len(states) != self.info.num_layers + 1:
                got = "none" if states is None else f"{len(states)}"
                raise ValueError(f"the drafter taps target layers {list(self.taps)}, but target "
                                 f"{type(self.model).__name__} returned {got} hidden states with "
                                 f"output_hidden_states=True (expected {self.info.num_layers + 1})")
            hidden = torch.cat([states[i + 1] for i in self.taps], dim=-1)  # [R, T, len(taps) * D]
        return logits, hidden


# ---- cache surgery (DynamicCache, any transformers version) -----------------------------------------
def _kv_pairs(cache) -> list[tuple[Any, str, str]]:
    """(holder, key attribute, value attribute) per layer: ``layers[i].keys/values`` (transformers
    >= 4.56) or ``key_cache[i]/value_cache[i]`` (older)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer, "keys", "values") for layer in layers if getattr(layer, "keys", None) is not None]
    return [(i, "key_cache", "value_cache") for i in range(len(cache.key_cache))]


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def crop_to(cache, length: int) -> None:
    """Roll the cache back to ``length`` slots (``crop`` with a negative count: the form every
    transformers version reads as "remove that many"; ``crop(0)`` only on the layered caches of
    transformers >= 4.56, where it is not "crop to nothing")."""
    remove = cache_length(cache) - length
    if remove > 0:
        cache.crop(-remove)
    elif any(getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", ())):
        cache.crop(0)  # nothing rejected: a sliding layer that records its past trims it back to the window


def select_rows(cache, keep: torch.Tensor) -> None:
    """Keep batch rows ``keep`` [R'] of every layer, in that order."""
    cache.batch_select_indices(keep)


def compact(cache, valid: torch.Tensor, width: Optional[int] = None) -> torch.Tensor:
    """Move every row's valid slots to the right end, in order, and drop the columns that are then
    holes in every row. valid: [R, S] bool; width: the most valid slots of a row when the caller
    knows it (else read back: one host sync). Returns the new valid mask [R, width]. Attention is
    causal over slots, so keeping each row's order keeps its output; positions were baked into the
    keys by RoPE and do not move."""
    if width is None:
        width = int(valid.sum(dim=1).max())
    order = torch.argsort(valid.to(torch.int8), dim=1, stable=True)  # holes first, then valid slots in order
    idx = order[:, valid.shape[1] - width:]  # [R, S']
    for holder, k_name, v_name in _kv_pairs(cache):
        for name in (k_name, v_name):
            if isinstance(holder, int):  # old API: lists on the cache
                store = getattr(cache, name)
                store[holder] = _gather_slots(store[holder], idx)
            else:
                setattr(holder, name, _gather_slots(getattr(holder, name), idx))
    return valid.gather(1, idx)


def _gather_slots(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t [R, H, S, Dh], idx [R, S'] -> [R, H, S', Dh]."""
    r, h, _, d = t.shape
    return t.gather(2, idx[:, None, :, None].expand(r, h, idx.shape[1], d).to(t.device))



# ---- what a call may ask of the target ------------------------------------------------------------
def position_limit(target) -> Optional[int]:
    """The target's ``max_position_embeddings`` (of its text config), or None when it states none."""
    config = getattr(target, "config", None)
    limit = getattr(config.get_text_config() if hasattr(config, "get_text_config") else config,
                    "max_position_embeddings", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def check_positions(target, longest_prompt: int, max_new_tokens: int) -> None:
    """The longest prompt plus ``max_new_tokens`` must fit the target's positions (so a call with a
    huge ``max_new_tokens`` and no EOS is refused here, not run without end)."""
    limit = position_limit(target)
    if limit is not None and longest_prompt + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens {max_new_tokens} after a prompt of {longest_prompt} tokens needs "
                         f"{longest_prompt + max_new_tokens} positions, more than the target's "
                         f"max_position_embeddings {limit}; use max_new_tokens <= {max(limit - longest_prompt, 0)}")


def check_tokenizer(tokenizer, vocab_size: int) -> None:
    """A tokenizer with tokens past the target's vocabulary is another model's: refuse it."""
    if tokenizer is None:
        return
    from dllm.models.text.tokenizer import tokenizer_size

    n = tokenizer_size(tokenizer)
    if n > vocab_size:
        raise ValueError(f"the tokenizer has {n} tokens but the target's vocabulary has {vocab_size}; pass the "
                         f"target's own tokenizer (load_target returns it)")


def check_tree_room(builder, target, longest: int) -> None:
    """A round holds the committed slots plus 1 + budget tree slots; refuse more than the target's
    ``max_position_embeddings`` (the size a static cache of the model would have)."""
    limit = position_limit(target)
    budget = builder.config.budget
    if limit is not None and longest + 1 + budget > limit:
        raise ValueError(f"a tree of {budget} nodes on top of {longest} tokens (the longest prompt + "
                         f"max_new_tokens) needs {longest + 1 + budget} cache slots, more than the target's "
                         f"max_position_embeddings {limit}; use a smaller budget or fewer tokens")



def whole_weight(module: nn.Module) -> torch.Tensor:
    """``module.weight`` as one tensor: a DTensor (a target loaded with ``tensor_parallel=N``, split by
    transformers' tensor-parallel plan) is gathered once and kept on the module; others as they are.
    A drafter that reads the target's embedding or head rows needs them whole."""
    weight = module.weight
    if not hasattr(weight, "full_tensor"):
        return weight
    kept = getattr(module, "_dllm_whole_weight", None)
    if kept is None:
        kept = weight.full_tensor().detach()
        module._dllm_whole_weight = kept
    return kept


def whole_linear(head: nn.Module) -> nn.Module:
    """An LM head a drafter can call on plain tensors: itself, or (split by a tensor-parallel plan) a
    bias-free ``nn.Linear`` over its gathered weight, kept on the module."""
    if not hasattr(head.weight, "full_tensor"):
        return head
    kept = getattr(head, "_dllm_whole_linear", None)
    if kept is None:
        weight = whole_weight(head)
        kept = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
        kept.weight = nn.Parameter(weight, requires_grad=False)
        object.__setattr__(head, "_dllm_whole_linear", kept)  # not a submodule: no double-counted parameters
    return kept

__all__ = ["whole_linear", "whole_weight", "Target", "cache_length", "check_positions", "check_tokenizer", "check_tree_room", "compact", "crop_to",
           "position_limit", "select_rows"]
