"""The OpenAI-compatible HTTP layer over a backend: the FastAPI app, request validation, SSE,
replies, errors, Prometheus metrics and the page (``static/``)."""
