"""Shared fixtures for the model tests: both families, a saved tiny checkpoint, (one CPU thread: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
import pytest
import torch

from dllm.models import tiny

FAMILIES = ("llada", "dream")


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def saved(tmp_path: Path, family: str) -> Path:
    """A tiny model of ``family`` saved in the official layout."""
    path = tmp_path / f"tiny-{family}"
    tiny(family, seed=3).save_pretrained(path)
    return path
