"""Speculative-decoding benchmarks of an AR target: ``dllm bench spec`` (methods side by side) and
``dllm bench trees`` (draft trees against their budget).

``bench`` (``dllm bench spec``: the methods table), ``runners`` (one runner per method), ``report``
(rows and the table), ``flags`` (the flags both commands share), ``trees`` (``dllm bench trees``) /
``tree_runs`` / ``trees_report`` / ``tree_cost`` (draft trees against their budget).
"""
