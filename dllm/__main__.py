"""``python -m dllm``: the ``dllm`` command."""

import sys

from dllm.cli import main

sys.exit(main())
