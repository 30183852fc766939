"""Shared fixtures for the model tests: both families, a saved tiny checkpoint, one CPU thread."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch

from dllm.models import tiny

FAMILIES = ("llada", "dream")


@pytest.fixture(autouse=True)
def _one_cpu_thread() -> Iterator[None]:
    """Tiny matmuls gain nothing from threads, and on a busy 2-core machine the thread pool's
    spin-waiting made each one ~1000x slower (15 ms instead of 15 us). Restored after each test."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def saved(tmp_path: Path, family: str) -> Path:
    """A tiny model of ``family`` saved in the official layout."""
    path = tmp_path / f"tiny-{family}"
    tiny(family, seed=3).save_pretrained(path)
    return path
