"""``dllm bench spec``: speculative decoding of an AR target, methods side by side, and draft trees.

``bench`` (the methods table; ``--trees`` hands over to ``trees``), ``runners`` (one runner per
method), ``report`` (rows and the table), ``flags`` (the flags both modes share), ``trees`` /
``tree_runs`` / ``trees_report`` / ``tree_cost`` (draft trees against their budget).
"""
