"""Continuable setup contributions: host-side hooks installed into every activation.

``register(contribution)`` returns its disposer. A contribution is a callable
``contribution(ActivationInfo) -> dispose`` (``dispose`` a callable or
``None``), applied synchronously, in registration order, to every continuable
child while it materialises — fresh start and cold resume — before its ids
are handed out or its activation is announced:

* an installer that raises releases the installations the batch already
  made (newest first) and the child is not established (the error propagates);
* a contribution revoked while a child is being built (even by its own
  installer) invalidates the batch: publication raises
  ``ACTIVATION_SETUP_REVOKED`` and the child is not established;
* a new registration reaches only the next activations; revoking one
  releases every resident installation of it at once;
* releasing is idempotent per installation (revocation and activation
  disposal converge); every disposer is attempted before failures are
  aggregated into ``ACTIVATION_SETUP_RELEASE_FAILED``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import SetupError

__all__ = ["ActivationInfo", "Contribution", "SetupBatch", "SetupRegistry"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActivationInfo:
    """What a contribution learns about the activation it is installed into."""

    child_id: str
    parent_id: str
    label: str
    provider: str
    depth: int
    epoch: int
    resumed: bool


Contribution = Callable[[ActivationInfo], Any]


@dataclass(eq=False)
class _Entry:
    contribution: Contribution
    revoked: bool = False
    installations: list["_Installation"] = field(default_factory=list)


@dataclass(eq=False)
class _Installation:
    entry: _Entry
    dispose: Callable[[], Any] | None
    released: bool = False

    def release(self) -> BaseException | None:
        if self.released:
            return None
        self.released = True
        if self in self.entry.installations:
            self.entry.installations.remove(self)
        if self.dispose is None:
            return None
        try:
            self.dispose()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a disposer's own BaseException too: it ended the supervisor's task group
            return exc
        return None


def _release_all(installations: list[_Installation], what: str) -> None:
    failures = [exc for exc in (i.release() for i in reversed(installations)) if exc is not None]
    if failures:
        raise SetupError.release_failed(what, failures) from failures[0]


class SetupBatch:
    """The installations made for one activation."""

    def __init__(self, installations: list[_Installation]) -> None:
        self._installations = installations

    def commit(self) -> None:
        """At publication: fail if any contribution of the batch was revoked meanwhile."""
        if any(i.entry.revoked for i in self._installations):
            self.release("setup rollback")
            raise SetupError.revoked()

    def release(self, what: str = "child scope disposal") -> None:
        _release_all(self._installations, what)


class SetupRegistry:
    def __init__(self) -> None:
        self._entries: list[_Entry] = []

    def register(self, contribution: Contribution) -> Callable[[], None]:
        entry = _Entry(contribution)
        self._entries.append(entry)

        def revoke() -> None:
            if entry.revoked:
                return
            entry.revoked = True
            if entry in self._entries:
                self._entries.remove(entry)
            _release_all(list(entry.installations), "contribution removal")

        return revoke

    def install(self, info: ActivationInfo) -> SetupBatch:
        """Apply every registered contribution, in order; on a failure release the batch and re-raise."""
        made: list[_Installation] = []
        for entry in list(self._entries):
            try:
                dispose = entry.contribution(info)
            except BaseException:
                try:
                    _release_all(made, "setup rollback")
                except SetupError:
                    log.exception("releasing a failed setup batch of %s also failed", info.child_id)
                raise
            installation = _Installation(entry, dispose if callable(dispose) else None)
            entry.installations.append(installation)
            made.append(installation)
        return SetupBatch(made)
