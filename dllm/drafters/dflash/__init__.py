"""DFlash, DFlash 2 and DFlare block drafters (arXiv 2602.06036, z-lab/dflash; DFlare arXiv 2606.02091).

    config.py         DFlashConfig: the drafter's shape and the target layers it taps
    ops.py            rotary tables, the block attention mask, positions
    cache.py          DraftKVCache: the drafter's context K/V per call
    model.py          DFlashDrafter (the network) and draft_block (one drafted block)
    dflash2/          DFlash 2: the candidate selector and grouped dynamic convolution (model.py),
                      its checkpoints and load_any_dflash, the architecture from config.json (io.py)
    io.py             official checkpoints <-> DFlashDrafter (load_dflash, save_dflash, random_dflash)
    dflare/           DFlare: per-layer fusion of the tapped target layers, separate context K/V projections
                      (model.py); its checkpoints (Tencent/AngelSlim QwenDFlareDraftModel) <-> DFlareDrafter (io.py)
    block_head.py     the per-request plan head read by ``plan="auto"`` (block_head.json beside a checkpoint)
    drafter.py        the registered ``dflash`` drafter (speculative_generate's ``drafter="dflash:model=..."``)

The names below resolve lazily (importing this package loads no module), so each module imports
its siblings directly and this file adds no import edge.
"""

from __future__ import annotations

from dllm.lazy import lazy_exports

_LAZY = {
    "DFlashBlockDrafter": "drafter", "DFlashOptions": "drafter", "DFlashSession": "drafter",
    "DFlashConfig": "config", "tap_layer_ids": "config",
    "DraftKVCache": "cache",
    "DFlashDrafter": "model", "draft_block": "model",
    "DFlash2Config": "dflash2.model", "DFlash2Drafter": "dflash2.model", "draft_block2": "dflash2.model",
    "load_dflash": "io", "save_dflash": "io", "random_dflash": "io",
    "load_dflash2": "dflash2.io", "save_dflash2": "dflash2.io", "random_dflash2": "dflash2.io",
    "load_any_dflash": "dflash2.io", "dflash_version": "dflash2.io",
    "DFlareConfig": "dflare.model", "DFlareDrafter": "dflare.model",
    "load_dflare": "dflare.io", "save_dflare": "dflare.io", "random_dflare": "dflare.io",
    "BlockHead": "block_head", "load_block_head": "block_head", "has_block_head": "block_head",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = sorted(_LAZY)
