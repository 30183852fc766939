"""``tiny-dream-long``: the shipped long-prompt Dream model, end to end (``python -m dllm.train --recipe
tiny-dream-long``).

The chain of stages (each a fresh AdamW, warm-up 50, cosine to 10% over its ``steps``, seed 0, from
the previous stage's checkpoint; ``stop_at``: where a stage was stopped): the PB-mini model, the
long-prompt length curriculum (``long_prompt.py``), key widths at RoPE base 10^6 (``rd-*``), then
counting (``rdc-*``). What each stage taught and the shipped model's accuracy: docs/results/models.md
("How the long-prompt models were trained").
"""

from __future__ import annotations

from dllm.train.recipes.base import recipes
from dllm.train.recipes.llada_long import first_stages
from dllm.train.recipes.long_prompt import long_model
from dllm.train.recipes.stages import Curriculum, Stage, curricula, key_stage, with_rope_theta

NAME = "tiny-dream-long"
MODEL_1E6 = with_rope_theta(long_model(recipes.get("tiny-dream")), 1e6)
LOOKS = ("lookup_long:0.3:4:339", "lookup_any:0.1:4:339", "span_copy_far:0.15:16:2039")  # rdc-2 .. rdc-4
L2 = ("lookup_long:1:4:339", "lookup_any:0.25:4:339", "span_copy_far:0.3:16:2039", "count_c16:0.5:16:2040",
      "count_c8:0.25:8:512")  # rd-L2, rd-L3


def full(lookup_weight: float) -> tuple[str, ...]:
    """The full-length count mixture of ``rdc-5`` .. ``rdc-9`` (lists up to 2,040 items)."""
    return ("count_c16:1:16:2040", "count_c8:0.25:8:1024", f"lookup_long:{lookup_weight}:4:339",
            "lookup_any:0.1:4:339", "span_copy_far:0.15:16:2039")


def _stages() -> tuple[Stage, ...]:
    def s(name, steps, lr, batch, *specs, threads=1, **kw):
        return key_stage(NAME, name, MODEL_1E6, "dream", steps, lr, batch, *specs, threads=threads, **kw)

    return (
        *first_stages("tiny-dream", NAME),
        # key widths at base 10^6 (long-rope-dream.sh), one thread
        s("rd-k1", 3000, 1e-3, 64, "lookup_k1:1:4:8", "span_copy_far:0.25:16:64", stop_at=2000),
        s("rd-k2", 1000, 1e-3, 64, "lookup_k2:1:4:16", "lookup_k1:0.25:4:16", "span_copy_far:0.25:16:64",
          stop_at=400),
        s("rd-k3", 1000, 1e-3, 64, "lookup_long:1:4:16", "lookup_k2:0.25:4:16", "count_long:0.5:24:95",
          "span_copy_far:0.25:16:96", stop_at=400),
        s("rd-k4", 600, 6e-4, 32, "lookup_long:1:4:42", "lookup_k2:0.25:4:32", "span_copy_far:0.25:16:256",
          "count_c4:0.25:4:12", "count_c8:0.25:8:64"),
        s("rd-L1", 400, 5e-4, 16, "lookup_long:1:4:172", "lookup_any:0.25:4:172", "span_copy_far:0.3:16:1036",
          "count_c8:0.25:8:128", "count_c16:0.5:16:512"),
        s("rd-L2", 300, 5e-4, 8, *L2),
        s("rd-L3", 300, 3e-4, 8, *L2, note="C = 0 mean 68.8% (count 12.5%)"),
        # counting at base 10^6 (long-count-dream.sh)
        s("rdc-1", 400, 1e-3, 32, "count_c4:1:4:12", "count_c8:1:8:32", "lookup_long:0.15:4:339",
          "span_copy_far:0.1:16:2039"),
        s("rdc-2", 400, 8e-4, 16, "count_c16:1:16:128", "count_c8:0.5:8:64", *LOOKS, threads=2),
        s("rdc-3", 600, 6e-4, 16, "count_c16:1:16:256", "count_c8:0.25:8:128", *LOOKS, threads=2),
        s("rdc-4", 400, 5e-4, 8, "count_c16:1:16:1024", "count_c8:0.25:8:256", *LOOKS, threads=2),
        s("rdc-5", 300, 5e-4, 8, *full(0.3), threads=2),
        s("rdc-6", 500, 3e-4, 8, *full(0.3)),
        s("rdc-7", 900, 2e-4, 8, *full(0.3)),
        s("rdc-8", 1000, 2e-4, 8, *full(0.3), threads=2),
        s("rdc-9", 1000, 1.5e-4, 8, *full(0.4), threads=2),
    )


curricula.add(NAME, Curriculum(
    NAME, _stages(), "tiny-dream + the long-prompt length curriculum, key widths and counting at RoPE base 10^6",
    replaces=("long-rope-dream.sh", "long-count-dream.sh", "long-keys-dream.sh"),
), description="tiny-dream continued on the long-prompt suite (18 stages)")

__all__ = ["L2", "MODEL_1E6", "full"]
