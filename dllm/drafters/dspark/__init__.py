"""DSpark (arXiv 2607.05147): a semi-autoregressive drafter (``drafter.py``: a DFlash-style parallel block
plus a Markov head, ``model.py`` / ``markov.py``, checkpoints in the authors' format ``io.py``) and its
confidence-scheduled verify length (``verify_length.py``), which the ``scheduled`` drafter
(``scheduled.py``) applies to any drafter that returns its per-position distributions."""
