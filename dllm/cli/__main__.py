"""``python -m dllm.cli``: the ``dllm`` command."""

import sys

from dllm.cli import main

sys.exit(main())
