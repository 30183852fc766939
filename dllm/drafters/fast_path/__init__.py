"""The batch-1 fast path of ``speculative_generate``: one prompt, a chain plan, one host sync per round.

    fast_loop.py       FastRun (the round on a static KV buffer) and fast_path_issue (when it applies)
    static_target.py   StaticTarget: a transformers Qwen3 / Qwen2 / Llama forward over a preallocated
                       KV buffer, op for op as transformers' modelling files

The drafter side of the path is the drafter's own (DFlash: ``dflash/static_draft.py``).
This file imports nothing (each module imports its siblings).
"""
