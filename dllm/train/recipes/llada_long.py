"""``tiny-llada-long``: the shipped long-prompt LLaDA model, end to end (``python -m dllm.train --recipe
tiny-llada-long``).

The chain of stages (each a fresh AdamW, warm-up 50, cosine to 10% over its ``steps``, seed 0, from
the previous stage's checkpoint; ``stop_at``: where a stage was stopped): the PB-mini model, the
long-prompt length curriculum (``long_prompt.py``), key widths (``kc-*``), counting (``cc-*``), then
RoPE base 10^6 (``rt-*``). ``threads``: as run (another count gives other float sums, so a rerun is
the same recipe, not the same bits). What each stage taught and the shipped model's accuracy:
docs/results/models.md ("How the long-prompt models were trained").
"""

from __future__ import annotations

from dataclasses import replace

from dllm.train.recipes.base import recipes
from dllm.train.recipes.long_prompt import first_long_recipe, long_model
from dllm.train.recipes.pb_mini import pb_mini_stage
from dllm.train.recipes.stages import Curriculum, Stage, curricula, key_stage, renamed, with_rope_theta

NAME = "tiny-llada-long"
MODEL = long_model(recipes.get("tiny-llada"))  # 88 words, RoPE base 10^4
MODEL_1E6 = with_rope_theta(MODEL, 1e6)

# the length curriculum's mixtures (prompts of <= 260 / 520 / 1,040 / 2,048 words)
LEN1 = ("lookup_long:1:4:42", "lookup_any:0.25:4:42", "span_copy_far:0.5:16:256", "count_long:0.5:24:255",
        "count_c4:0.5:24:100")
LEN2 = ("lookup_long:1:4:85", "lookup_any:0.25:4:85", "span_copy_far:0.5:16:516", "count_long:0.5:24:515",
        "count_c4:0.25:24:200")
LEN3 = ("lookup_long:1:4:172", "lookup_any:0.25:4:172", "span_copy_far:0.5:16:1036", "count_long:0.5:24:1035")
LEN4 = ("lookup_long:1:4:339", "lookup_any:0.25:4:339", "span_copy_far:0.5:16:2039", "count_long:0.5:24:2040")
K3 = ("lookup_long:1:4:16", "lookup_k2:0.25:4:16", "count_long:0.5:24:95", "span_copy_far:0.25:16:96")
LOOKS = ("lookup_long:0.3:4:339", "lookup_any:0.1:4:339", "span_copy_far:0.15:16:2039")  # rt-3 .. rt-6
FULL = ("count_c16:1:16:2040", "count_c8:0.25:8:1024", "lookup_long:0.5:4:339", "lookup_any:0.1:4:339",
        "span_copy_far:0.15:16:2039")  # rt-8, rt-9


def first_stages(base: str, chain: str) -> tuple[Stage, Stage]:
    """``base`` from scratch (its ``best``), then the long-prompt length curriculum from it."""
    first = first_long_recipe(base)
    length = replace(first, name=f"{chain}/length", init_from=None)
    return renamed(pb_mini_stage(base), chain), Stage("length", length, note="the first long model (step 3,550)")


def _stages() -> tuple[Stage, ...]:
    def s(name, steps, lr, batch, *specs, model=MODEL, **kw):
        return key_stage(NAME, name, model, "llada", steps, lr, batch, *specs, **kw)

    def rt(name, steps, lr, batch, *specs, threads=2):
        return s(name, steps, lr, batch, *specs, model=MODEL_1E6, threads=threads)

    return (
        *first_stages("tiny-llada", NAME),
        # key widths (long-keys.sh): 1-item keys at chance for ~850 steps, then the loss 0.8 -> 0.005
        s("kc-k1a", 600, 1e-3, 64, "lookup_k1:1:4:8"),
        s("kc-k1b", 2000, 1e-3, 64, "lookup_k1:1:4:8", stop_at=600),
        s("kc-k2", 1000, 1e-3, 64, "lookup_k2:1:4:16", "lookup_k1:0.25:4:16", stop_at=400),
        s("kc-k3", 1000, 1e-3, 64, *K3, stop_at=400),
        s("kc-L1", 500, 6e-4, 32, *LEN1, threads=2),
        s("kc-L2", 400, 6e-4, 16, *LEN2, threads=2),
        s("kc-L3", 300, 6e-4, 8, *LEN3, threads=2),
        s("kc-L4", 250, 6e-4, 4, *LEN4, threads=2),
        s("kc-L5", 400, 5e-4, 8, *LEN4, threads=2),
        s("kc-L6", 300, 3e-4, 8, *LEN4, threads=2, note="the second tiny-llada-long"),
        # counting (long-count.sh): short lists first, then a doubling at a time
        s("cc-1", 800, 1e-3, 64, "count_c4:1:4:12"),
        s("cc-2", 1000, 1e-3, 64, "count_c4:0.5:4:32", "count_c8:1:8:32", "lookup_long:1:4:16",
          "lookup_k2:0.25:4:16", "span_copy_far:0.25:16:64"),
        s("cc-3", 800, 1e-3, 48, "count_c16:1:16:64", "count_c8:0.5:8:64", "lookup_long:0.5:4:24",
          "lookup_any:0.25:4:24", "span_copy_far:0.25:16:128"),
        s("cc-4", 800, 8e-4, 32, "count_c16:1:16:128", "count_c8:0.25:8:128", "lookup_long:0.5:4:42",
          "lookup_any:0.25:4:42", "span_copy_far:0.25:16:256"),
        s("cc-5", 600, 6e-4, 16, "count_c16:1:16:256", "count_c8:0.25:8:256", "lookup_long:0.5:4:85",
          "lookup_any:0.25:4:85", "span_copy_far:0.25:16:516", threads=2),
        s("cc-6", 500, 5e-4, 8, "count_c16:1:16:512", "count_c8:0.25:8:512", "lookup_long:0.5:4:170",
          "lookup_any:0.25:4:170", "span_copy_far:0.25:16:1036"),
        s("cc-8", 300, 5e-4, 8, "count_c16:1:16:1024", "count_c8:0.25:8:1024", "lookup_long:0.5:4:339",
          "lookup_any:0.25:4:339", "span_copy_far:0.5:16:2039", threads=2),
        s("cc-9", 400, 5e-4, 8, "count_c16:1:16:2040", "count_c8:0.25:8:2040", "lookup_long:0.5:4:339",
          "lookup_any:0.25:4:339", "span_copy_far:0.5:16:2039", threads=2,
          note="the third tiny-llada-long: C = 0 mean 66.7%"),
        # RoPE base 10^6 (long-rope.sh): cc-9's mixture at the new base, then the count re-formed
        rt("rt-1", 600, 5e-4, 8, "count_c16:1:16:2040", "count_c8:0.25:8:2040", "lookup_long:0.5:4:339",
           "lookup_any:0.25:4:339", "span_copy_far:0.5:16:2039"),
        rt("rt-2", 400, 1e-3, 32, "count_c4:1:4:12", "count_c8:1:8:32", "lookup_long:0.15:4:339",
           "span_copy_far:0.1:16:2039"),
        rt("rt-3", 400, 8e-4, 16, "count_c16:1:16:128", "count_c8:0.5:8:64", *LOOKS),
        rt("rt-4", 600, 6e-4, 16, "count_c16:1:16:256", "count_c8:0.25:8:128", *LOOKS, threads=1),
        rt("rt-5", 400, 5e-4, 8, "count_c16:1:16:1024", "count_c8:0.25:8:256", *LOOKS, threads=1),
        rt("rt-6", 300, 5e-4, 8, "count_c16:1:16:2040", "count_c8:0.25:8:1024", *LOOKS, threads=1),
        rt("rt-8", 500, 2e-4, 8, *FULL, threads=1),
        rt("rt-9", 600, 1e-4, 8, *FULL, threads=1),
    )


curricula.add(NAME, Curriculum(
    NAME, _stages(), "tiny-llada + the long-prompt length curriculum, key widths, counting and RoPE base 10^6",
    replaces=("long-keys.sh", "long-count.sh", "long-rope.sh", "length-mixes.sh", "key_curriculum.py"),
), description="tiny-llada continued on the long-prompt suite (28 stages)")

__all__ = ["FULL", "LEN1", "LEN2", "LEN3", "LEN4", "MODEL", "MODEL_1E6", "first_stages"]
