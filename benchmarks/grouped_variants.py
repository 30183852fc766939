"""Grouped verification variants against one buffer copy per variant (README "KV caches").

    python benchmarks/grouped_variants.py

``fast`` with ``cache="auto"`` on tiny-llada and tiny-dream at the speed issue's shape (a random
1,024-token prompt, 256 generated, blocks of 32), 2 threads: each configuration twice, alternating,
the faster of the two reported. The reference path (``CacheView.attend``: every variant attends to
its own copy of its row's keys and values) is patched in for the comparison; tokens must match.
"""

import torch

import dllm
from dllm.scoring.exact_match import load_model
from dllm.models.core import kv as KV


def main(argv=None) -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # --help; no options
    torch.set_num_threads(2)
    grouped = KV.RowsView.attend
    for name in ("tiny-llada", "tiny-dream"):
        model = load_model(name)
        prompt = torch.randint(10, 70, (1, 1024), generator=torch.Generator().manual_seed(0))
        kw = dict(gen_length=256, block_length=32, cache="auto", sampler="fast")
        dllm.generate(model, prompt[:, :64], **{**kw, "gen_length": 32})  # warm-up
        wall, seqs = {}, {}
        for _ in range(2):
            for label, attend in (("grouped", grouped), ("copy per variant", KV.CacheView.attend)):
                KV.RowsView.attend = attend
                out = dllm.generate(model, prompt, **kw)
                wall[label] = min(wall.get(label, float("inf")), out.wall_time)
                seqs[label] = out.sequences
        KV.RowsView.attend = grouped
        print(f"{name}: fast + auto at 1024 + 256: grouped {wall['grouped']:.2f} s, one copy per variant "
              f"{wall['copy per variant']:.2f} s, x{wall['copy per variant'] / wall['grouped']:.2f}, "
              f"same tokens: {torch.equal(seqs['grouped'], seqs['copy per variant'])}")


if __name__ == "__main__":
    main()
