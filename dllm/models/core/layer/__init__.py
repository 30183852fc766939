"""One transformer layer and its parts: the layer's modules (``block``: ``TransformerBlock``, its
``Attention`` and ``MLP`` weights, the attention masks), RMSNorm in each family's rounding (``norm``),
RoPE (``rope``), the fused q/k/v and gate/up path (``fused``) and LLaDA 2's sparse MoE feed-forward
(``moe``). ``dllm.models.core.transformer`` stacks the layers into the model."""
