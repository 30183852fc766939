"""``load_target`` of a local target draws no transformers progress bar ("Loading weights") on stderr, and
leaves transformers' progress-bar setting (``transformers.utils.logging``) as the caller had it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterator

import pytest
from transformers.utils import logging as hf_logging

from dllm.models.loading import locate
from dllm.models.targets import load_target


@pytest.fixture(params=[True, False], ids=["bars-on", "bars-off"])
def bars(request: pytest.FixtureRequest) -> Iterator[bool]:
    """transformers' progress bars set on or off by the caller; put back as they were after the test."""
    before = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if request.param else hf_logging.disable_progress_bar)()
    try:
        yield request.param
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


def test_load_target_is_quiet_and_keeps_the_progress_bar_setting(bars: bool, capfd: pytest.CaptureFixture) -> None:
    model, _ = load_target("tiny-ar")
    assert model is not None
    assert capfd.readouterr().err == ""
    assert hf_logging.is_progress_bar_enabled() is bars


def test_a_failed_load_keeps_the_progress_bar_setting(bars: bool, tmp_path: Path) -> None:
    """Weights that do not fit config.json fail inside transformers' load; the setting is restored all the same."""
    directory = tmp_path / "tiny-ar"
    shutil.copytree(locate("tiny-ar"), directory)
    config = json.loads((directory / "config.json").read_text())
    config["intermediate_size"] = 100  # the checkpoint's MLP weights are 384 wide
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="its weights do not fit its config.json"):
        load_target(str(directory))
    assert hf_logging.is_progress_bar_enabled() is bars


def test_load_target_keeps_the_hubs_own_progress_bar_setting(bars: bool) -> None:
    """Download bars turned off in huggingface_hub alone stay off (transformers' switch turns both)."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hub_off = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        load_target("tiny-ar")
        assert are_progress_bars_disabled() and hf_logging.is_progress_bar_enabled() is bars
    finally:
        (disable_progress_bars if hub_off else enable_progress_bars)()
