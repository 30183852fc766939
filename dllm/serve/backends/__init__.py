"""The serving backends: requests and their events (``jobs``), the backend interface (``base``), the
scheduler, continuous batching by merged forwards (``batcher``), final-prefix text streaming
(``stream``), and the diffusion and speculative backends."""
