"""``python -m dllm.eval.harness``: lm-eval's command line with the model ``dllm`` registered and the
stress tasks' directory as ``--include_path`` (``dllm.eval.harness.model.main``)."""

from dllm.eval.harness.model import main

if __name__ == "__main__":
    main()
