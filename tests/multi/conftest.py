"""Fixtures of the multi-process tests: hosts (Supervisors in other processes) that never outlive a test."""

from __future__ import annotations

import pytest

from ._driver import HostFactory


@pytest.fixture
def hosts(tmp_path):
    factory = HostFactory(tmp_path)
    yield factory
    assert factory.cleanup() == [], "processes of a host outlived it"
