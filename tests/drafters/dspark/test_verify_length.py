"""Verify-length policies (``dllm/drafters/dspark/verify_length.py``): the rules on hand-made
confidences, the registry's errors, and cutting a ``Draft``."""

import pytest
import torch

from dllm.drafters.base import Draft
from dllm.drafters.dspark.verify_length import (leading_count, make_verify_length, schedule_draft, top_confidence,
                                                verify_lengths)

CONF = torch.tensor([[0.9, 0.8, 0.4, 0.9],   # first below 0.5 at 2; survival 0.9, 0.72, 0.29, 0.26
                     [0.3, 0.9, 0.9, 0.9],   # first below 0.5 at 0
                     [0.99, 0.99, 0.99, 0.99]])  # never below


def test_leading_count():
    keep = torch.tensor([[True, True, False, True], [False, True, True, True], [True] * 4])
    assert leading_count(keep).tolist() == [2, 0, 4]


def test_threshold_is_the_first_position_below():
    assert make_verify_length("threshold:threshold=0.5").lengths(CONF).tolist() == [2, 0, 4]
    assert make_verify_length("threshold:threshold=0.0").lengths(CONF).tolist() == [4, 4, 4]
    assert make_verify_length("threshold:threshold=0.5,min_length=1").lengths(CONF).tolist() == [2, 1, 4]


def test_survival_is_the_cumulative_product():
    assert make_verify_length("survival:threshold=0.5").lengths(CONF).tolist() == [2, 0, 4]
    assert make_verify_length("survival:threshold=0.7").lengths(CONF).tolist() == [2, 0, 4]
    assert make_verify_length("survival:threshold=0.75").lengths(CONF).tolist() == [1, 0, 4]
    assert make_verify_length("survival:threshold=0.975").lengths(CONF).tolist() == [0, 0, 2]


def test_full_and_cuts():
    assert make_verify_length("full").lengths(CONF).tolist() == [4, 4, 4]
    assert not make_verify_length("full").cuts
    assert not make_verify_length("threshold:threshold=0").cuts
    assert make_verify_length("survival:threshold=0.1").cuts


@pytest.mark.parametrize("spec, words", [
    ("nope", ["nope", "full", "survival", "threshold"]),
    ("threshold:thresh=0.5", ["thresh", "threshold", "min_length"]),
    ("threshold:threshold=1.5", ["threshold", "1.5"]),
    ("survival:min_length=-1", ["min_length", "-1"]),
])
def test_bad_policies_get_the_registrys_error(spec, words):
    with pytest.raises((ValueError, TypeError, KeyError)) as err:
        make_verify_length(spec)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_registered_names():
    assert {"full", "threshold", "survival"} <= set(verify_lengths.names())


def test_top_confidence_reads_probs_else_logits():
    """The top probability of each position (not the drafted token's: a sampled token's own
    probability would make the verify length depend on the draw)."""
    tokens = torch.tensor([[0, 1]])
    logits = torch.tensor([[[0.0, 2.0], [1.0, 1.0]]])
    got = top_confidence(Draft(tokens=tokens, logits=logits))
    assert torch.allclose(got, torch.tensor([[logits[0, 0].softmax(-1)[1], 0.5]]))
    probs = torch.tensor([[[0.3, 0.7], [0.6, 0.4]]])
    assert torch.allclose(top_confidence(Draft(tokens=tokens, probs=probs, logits=logits)), torch.tensor([[0.7, 0.6]]))
    with pytest.raises(ValueError, match="tokens only"):
        top_confidence(Draft(tokens=tokens))


def test_schedule_draft_narrows_to_the_longest_kept_row():
    tokens = torch.arange(12).reshape(3, 4)
    probs = torch.rand(3, 4, 5)
    d = schedule_draft(Draft(tokens=tokens, probs=probs, logits=probs.log(), forwards=2), torch.tensor([2, 0, 1]))
    assert d.tokens.tolist() == tokens[:, :2].tolist() and d.lengths.tolist() == [2, 0, 1]
    assert d.probs.shape == (3, 2, 5) and d.logits.shape == (3, 2, 5) and d.forwards == 2
    # the drafter's own lengths cap the policy's
    d = schedule_draft(Draft(tokens=tokens, lengths=torch.tensor([1, 4, 4])), torch.tensor([3, 3, 2]))
    assert d.lengths.tolist() == [1, 3, 2] and d.tokens.shape == (3, 3)
    # nothing kept: one slot still goes (the loop's minimum width), accepted by no row
    d = schedule_draft(Draft(tokens=tokens), torch.tensor([0, 0, 0]))
    assert d.tokens.shape == (3, 1) and d.lengths.tolist() == [0, 0, 0]
