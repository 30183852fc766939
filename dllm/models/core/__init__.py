"""The shared transformer and its parts: the architecture description (``config.py``), the model
(``transformer.py``: its layers run module by module or fused), one layer and its parts (``layer/``:
the layer's modules, RMSNorm, RoPE, fused q/k/v and gate/up weights, the MoE feed-forward), the K/V
buffers (``kv.py``) and the views a cached forward runs through (``views/``), WINO's shadow block
(``shadow.py``), padding-free forwards (``packed_rows.py``), mixed input embeddings
(``soft_inputs.py``) and ``torch.compile`` of the layers (``compile.py``).

Nothing here knows a checkpoint format; this file imports nothing (each module imports its siblings).
"""
