"""Training the speculative drafters of ``dllm.drafters``: the DFlash drafters (``dflash_train``),
the path head of the ``taps`` tree builder (``path_head_train``) and the block head behind
``plan="auto"`` (``block_head_train``)."""
