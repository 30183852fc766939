"""The serving engines: requests and their events (``jobs``), the engine interface (``base``), the
scheduler, continuous batching by merged forwards (``batcher``), final-prefix text streaming
(``stream``), and the diffusion and speculative engines."""
