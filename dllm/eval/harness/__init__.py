"""The lm-evaluation-harness side of dllm: the lm-eval model ``dllm`` and the stress tasks as lm-eval tasks.

- ``model``: ``DllmLM``, lm-eval's model ``dllm`` (its ``model_args`` are documented there);
- ``config``: ``HarnessConfig`` and ``split_model_args`` (the validation of ``model_args``);
- ``likelihood``: LLaDA's Monte-Carlo log-likelihood estimate;
- ``launch``: the processes of a data-parallel launch, their accelerator, the device;
- ``tasks``: the stress tasks' JSONL files and YAMLs (``lm_tasks/``) and their scorer.

``python -m dllm.eval.harness ...`` is lm-eval's own command line with the model registered and the
stress tasks included. When lm-eval is installed, importing this package registers the model, for
``lm_eval.simple_evaluate(model="dllm", ...)``; without it, ``config`` and ``tasks`` still import.
"""

from __future__ import annotations

from importlib.util import find_spec

if find_spec("lm_eval") is not None:
    from dllm.eval.harness.model import MODEL_NAME, DllmLM, cut_at_stops, main, register, steps_for, task_manager

    __all__ = ["MODEL_NAME", "DllmLM", "cut_at_stops", "main", "register", "steps_for", "task_manager"]
