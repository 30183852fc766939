"""The measured choices behind the recommended settings: ``fast`` (``dllm bench choose-fast``, the
sampler alias) and ``cache`` (``dllm bench choose-cache``, the ``auto`` cache policy)."""
