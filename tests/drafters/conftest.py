"""Fixtures shared by the drafter tests."""

import pytest


@pytest.fixture(scope="session")
def tiny_pair():
    """The shipped tiny pair: (``tiny-ar`` target, its tokenizer, the ``tiny-ar-dflash`` drafter), loaded once."""
    from dllm.drafters.base import make_drafter
    from dllm.models.targets import load_target

    target, tok = load_target("tiny-ar")
    return target, tok, make_drafter("dflash", model="tiny-ar-dflash")
