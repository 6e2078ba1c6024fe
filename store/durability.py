"""Durability policies: when an append reaches stable storage.

``strict`` fsyncs every append; ``batched`` (the default) fsyncs at commit
points — turn end, message acceptance, creation; ``none`` never fsyncs (tests,
benchmarks: a crash of the *machine* may lose recent records; a crash of the
process loses nothing the kernel already has). Each policy is a sibling class
behind ``Durability`` with two methods.

A failed fsync raises ``DurabilityError`` and is never retried: after a failed
fsync the kernel may have dropped the dirty pages, so a retry that "succeeds"
would report a false success (the fsyncgate lesson).
"""

from __future__ import annotations

import os
from typing import Literal

from .errors import DurabilityError

__all__ = ["DurabilityName", "Durability", "Strict", "Batched", "NoSync", "durability_policy"]

DurabilityName = Literal["strict", "batched", "none"]


def _fsync(fd: int, what: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise DurabilityError(f"fsync of {what} failed: {exc}", what=what) from exc


class Durability:
    name: DurabilityName

    def after_append(self, fd: int, what: str) -> None:
        """Called after every append is written."""
        raise NotImplementedError

    def at_commit(self, fd: int, what: str) -> None:
        """Called at a commit point (turn end, acceptance, creation)."""
        raise NotImplementedError

    @property
    def syncs_at_commit(self) -> bool:
        return self.name != "none"

    def commit_append(self, fd: int, what: str) -> None:
        """An append that is its own commit point (a message, an index row): one fsync under
        ``strict`` and ``batched`` alike, none under ``none``."""
        if self.syncs_at_commit:
            _fsync(fd, what)


class Strict(Durability):
    name = "strict"

    def after_append(self, fd: int, what: str) -> None:
        _fsync(fd, what)

    def at_commit(self, fd: int, what: str) -> None:
        """Every append was already synced."""


class Batched(Durability):
    name = "batched"

    def after_append(self, fd: int, what: str) -> None:
        """Deferred to the next commit point."""

    def at_commit(self, fd: int, what: str) -> None:
        _fsync(fd, what)


class NoSync(Durability):
    name = "none"

    def after_append(self, fd: int, what: str) -> None:
        """Never synced."""

    def at_commit(self, fd: int, what: str) -> None:
        """Never synced."""


def durability_policy(name: str) -> Durability:
    policies: dict[str, type[Durability]] = {"strict": Strict, "batched": Batched, "none": NoSync}
    try:
        return policies[name]()
    except KeyError:
        raise ValueError(f"unknown durability policy {name!r} (strict, batched or none)") from None
