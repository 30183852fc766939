"""``jetspec``: JetSpec's causal parallel draft head (Hu et al., arXiv 2606.18394; hao-ai-lab/JetSpec).

The head is a DFlash drafter (``dflash/model.py``: fused target taps as injected context K/V, the
target's embedding and LM head) whose block attention is causal: block position i sees the context
and block positions 0..i (``io.py``). One forward over ``[anchor, MASK x K]`` gives per-depth logits
[R, K, V] whose depth-d distribution never reads the masks after d, so the tree score of a path,
the sum of its per-depth log-probabilities (``tree.py``, ``accum_logp``), follows the left-to-right
factorisation the target verifies. The round is DFlash's (the same session: context K/V cache,
drafts read at block positions 1..K); what makes it JetSpec is the head and the tree:

    speculative_generate(target, "jetspec:model=tiny-ar-jetspec", prompts, max_new_tokens=64,
                         plan=Plan(block_size=16, tree="jetspec:budget=63,width=7"))

A chain plan (an int block size) verifies the head's arg-max chain, as the authors' chain drafter
does. Verification is the loop's: lossless at T = 0 (the target's greedy tokens) and exact at T > 0
(the tree walk draws from p at every node; chain drafts are sampled from the warped head logits and
accepted with min(1, p / q) when ``sample``, as ``dflash``).

Options (``JetSpecOptions``, DFlash's): ``model`` (embedded name, directory or Hub id of a head in
the authors' layout, ``config.json`` with ``dflash_config.causal_head: true``; or a loaded causal
``DFlashDrafter`` as ``model=``), ``dtype``, ``device``, ``sample``, ``quantization``. A bidirectional
DFlash checkpoint is refused (use ``dflash``). The default block size is the checkpoint's; a larger
one is refused. Not supported: the authors' ``draft_shift`` (I-DLM shift) heads, off in their
released examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dllm.drafters.base import DraftSession, DraftSetup, Drafter, TargetInfo, register_drafter
from dllm.drafters.dflash.drafter import DFlashBlockDrafter, DFlashOptions
from dllm.drafters.jetspec import tree as _tree  # noqa: F401  (registers the "jetspec" tree builder)
from dllm.drafters.jetspec.io import check_causal, load_jetspec
from dllm.models.loading import locate, place_module


@dataclass(frozen=True)
class JetSpecOptions(DFlashOptions):
    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ValueError(f"model must be a JetSpec head's name or path (or pass a causal DFlashDrafter as "
                             f"model=...), got {self.model!r}")
        super().__post_init__()


@register_drafter("jetspec")
class JetSpecDrafter(DFlashBlockDrafter):
    """JetSpec: a causal parallel draft head over the target's fused hidden states (arXiv 2606.18394)."""

    Config = JetSpecOptions
    trims_last_block = False  # the authors always draft B - 1 depths (accum_logp refuses fewer)

    def __init__(self, config: Optional[JetSpecOptions] = None, *, model: Any = None, **options: Any) -> None:
        if isinstance(model, (str, Path)):
            options["model"] = str(model)
            model = None
        Drafter.__init__(self, config, **options)  # the options only: the head is loaded here
        cfg = self.config
        if model is None:
            if cfg.model is None:
                raise ValueError("the jetspec drafter needs a JetSpec head: model=<DFlashDrafter> or a name/path "
                                 "(jetspec:model=tiny-ar-jetspec)")
            directory = locate(cfg.model)
            model = load_jetspec(directory, dtype=cfg.dtype, device=cfg.device, quantization=cfg.quantization)
            self._directory = Path(directory)
        else:
            check_causal(model)
            place_module(model, cfg.dtype, cfg.device)
        self.model = model.eval()

    def check_target(self, info: TargetInfo) -> None:
        c = self.model.config
        if c.hidden_size != info.hidden_size:
            raise ValueError(f"the jetspec head has hidden size {c.hidden_size} but the target's is {info.hidden_size}; "
                             f"it reads the target's hidden states, embedding and LM head, so it must be trained "
                             f"for this target")
        super().check_target(info)

    def begin(self, setup: DraftSetup) -> DraftSession:
        if setup.block_size > self.block_size:
            raise ValueError(f"block_size {setup.block_size} exceeds the jetspec head's trained block size "
                             f"{self.block_size}; use block_size <= {self.block_size}")
        return super().begin(setup)


__all__ = ["JetSpecDrafter", "JetSpecOptions"]
