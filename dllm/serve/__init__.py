"""Serving: an OpenAI-compatible HTTP server over its backends (``dllm serve``)."""
