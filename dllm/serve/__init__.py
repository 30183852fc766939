"""Serving: an OpenAI-compatible HTTP server over the decode engines (``dllm serve``)."""
