"""Fixtures of the store tests: every test owns a fresh store under its ``tmp_path``."""

from __future__ import annotations

import os

import pytest

from subagents import store


@pytest.fixture
def st(tmp_path) -> store.Store:
    """A fresh store with the default (``batched``) durability."""
    return store.Store(tmp_path / "store")


@pytest.fixture(params=["strict", "batched", "none"])
def any_st(request, tmp_path) -> store.Store:
    """The same test under every durability policy."""
    return store.Store(tmp_path / "store", durability=request.param)


@pytest.fixture
def umask_022():
    """Run with the common 022 umask, so a mode the store forgot to restrict shows."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)
