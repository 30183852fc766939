"""``dllm stress``: a ParallelBench-style sweep (arXiv 2510.04767) of samplers x parallelism x tasks.

``grid`` (the ``--grid`` entries and their settings), ``sweep`` (decode every cell, resumable),
``metrics`` (per-sample outcomes and their summaries), ``report`` (the tables), ``plots`` (PNGs).
"""
