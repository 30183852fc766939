"""The OpenAI-compatible HTTP layer over an engine: the FastAPI app, request validation, SSE,
replies, errors, Prometheus metrics and the page (``static/``)."""
