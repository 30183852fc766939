"""The shared transformer and its parts: the architecture description (``config.py``), the layer
(``transformer.py``: module-by-module reference and fused path), RMSNorm (``norm.py``), RoPE
(``rope.py``), fused q/k/v and gate/up weights (``fused.py``), the K/V buffers (``kv.py``), the MoE
feed-forward (``moe.py``), WINO's shadow block (``shadow.py``), padding-free forwards
(``packed_rows.py``) and ``torch.compile`` of the layers (``compile.py``).

Nothing here knows a checkpoint format; this file imports nothing (each module imports its siblings).
"""
