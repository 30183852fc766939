"""``python -m dllm.eval.harness``: lm-eval's command line with the model ``dllm`` registered and the
stress tasks' directory as ``--include_path`` (``dllm.eval.harness.model.main``).

Bad ``model_args`` (an unknown sampler, an option given twice, ...) and a stress task whose data files
are missing (``dllm eval harness-tasks`` writes them) end with one line naming the value and exit
status 2, as every ``dllm`` command does, instead of a traceback through lm-eval."""

import sys

from dllm.eval.harness.model import main

if __name__ == "__main__":
    try:
        main()
    except (ValueError, TypeError, KeyError, FileNotFoundError) as err:
        print(f"python -m dllm.eval.harness: error: {err}", file=sys.stderr)
        sys.exit(2)
