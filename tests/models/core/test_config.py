import pytest

from dllm.models import TransformerConfig

BASE = dict(vocab_size=32, d_model=16, n_layers=1, n_heads=4, n_kv_heads=2, mlp_hidden=32)


def test_head_dim_and_frozen():
    cfg = TransformerConfig(**BASE)
    assert cfg.head_dim == 4
    with pytest.raises(Exception):
        cfg.d_model = 8  # type: ignore[misc]


@pytest.mark.parametrize("field, value, pattern", [
    ("n_kv_heads", 3, r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"),
    ("d_model", 18, r"d_model \(18\) must be divisible by n_heads \(4\)"),
    ("vocab_size", 0, r"vocab_size must be a positive int, got 0"),
    ("n_layers", -1, r"n_layers must be a positive int, got -1"),
    ("rms_eps", 0.0, r"rms_eps must be a positive number, got 0.0"),
    ("mlp_hidden", 2.5, r"mlp_hidden must be a positive int, got 2.5"),
])
def test_validation_names_the_value(field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        TransformerConfig(**{**BASE, field: value})


def test_odd_head_dim_rejected():
    with pytest.raises(ValueError, match="even head_dim"):
        TransformerConfig(**{**BASE, "d_model": 12, "n_heads": 4, "n_kv_heads": 4})


def test_odd_explicit_head_dim_names_attn_head_dim():
    """An odd attn_head_dim is named as such (the message used to blame d_model / n_heads, here
    16 / 4 = 4, and print "= 7")."""
    with pytest.raises(ValueError, match=r"even head_dim; got attn_head_dim = 7$"):
        TransformerConfig(**{**BASE, "attn_head_dim": 7})
    with pytest.raises(ValueError, match=r"even head_dim; got d_model 12 / n_heads 4 = 3$"):
        TransformerConfig(**{**BASE, "d_model": 12, "n_heads": 4, "n_kv_heads": 4})
