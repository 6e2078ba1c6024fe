"""Fixtures of the crash tests."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from ._power_loss import LoopFs, journal_less_disk


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[LoopFs]:
    """An ext4 without a journal in a loop-attached file: see ``_power_loss.py``."""
    with journal_less_disk(tmp_path) as fs:
        yield fs
