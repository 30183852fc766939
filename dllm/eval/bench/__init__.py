"""Benchmarks of the diffusion decode and the measurements behind the recommended settings.

``throughput`` (``dllm bench throughput``), ``caches`` (``dllm bench caches``), ``kernels``
(``dllm bench kernels``), ``breakdown`` (``dllm bench breakdown``), ``e2e`` (``dllm bench e2e``),
``choose`` (``fast`` / ``cache``: how ``fast`` and ``auto`` were chosen), ``timing`` (timers and
peak memory).
"""
