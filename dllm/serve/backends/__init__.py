"""The serving backends: requests and their events (``jobs``), the backend interface (``base``), the
scheduler with its admission policies and merged forwards (``scheduling``), final-prefix text streaming
(``stream``), and the diffusion and speculative backends."""
