"""The tiny random Qwen3 targets of the speculative-decoding benchmark tests (task vocabulary size)."""

import torch

VOCAB, EOS, MASK = 88, 4, 1


def tiny_qwen3(layers: int = 2, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, eos_token_id=EOS, pad_token_id=0,
                         initializer_range=0.5)  # peaked logits: outputs loop, so drafts get accepted
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).float().eval()
