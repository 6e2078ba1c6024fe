"""Removing the records crashed supervisors left in ``owners/``.

A record is removed once its owner is gone for good (``owner_gone``) and no
unreleased lease names it. A live owner's record is its proof of life, and a
dead owner's record that a lease still names is how ``check_store`` tells a
crashed holder (harmless) from one that closed without releasing.

Knowing that no lease names an owner costs a read of every session's lease.
A gone owner never writes again, so the leases naming it only move away from
it (a takeover, a collected session): once a complete scan has found where
they are, a later pass need only read those again. ``OwnerReaper`` keeps that
finding for the life of the object (a supervisor keeps one: its pass at open
scans, its pass at close reads the few leases the scan found), and scans
again only when an owner it has not seen gone turns up. Nothing of it is
written: a new process scans once.
"""

from __future__ import annotations

import os
from typing import Iterable

from .errors import CorruptSessionError, SessionNotFoundError, UnavailableSessionError
from .ids import is_valid_session_id
from .lease import check_lease, host_identity, owner_alive, owner_gone, read_owner, remove_owner
from .root import Store

__all__ = ["OwnerReaper", "reap_owners"]


class OwnerReaper:
    """Reaps ``owners/`` for one store, remembering where the leases of gone owners still were.

    Not thread-safe: one pass at a time (the lease keeper runs its passes one after another).
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._held: dict[str, set[str]] = {}  # gone owner -> the sessions whose lease named it at the last read
        self.leases_read = 0  # for statistics: what reaping has cost so far

    def reap(self, *, dry_run: bool = False) -> list[str]:
        """Remove the records of gone owners no unreleased lease names; the ids removed (``dry_run``: that would go).

        Costs one read of ``owners/``; then, only when some record is of a gone owner, one lease read per
        session on the first pass that meets that owner, and one per session still naming it on later passes.
        A lease that cannot be read may name anyone: then nothing is removed.
        """
        gone = self._gone_owners()
        self._held = {owner: sessions for owner, sessions in self._held.items() if owner in gone}
        if not gone:
            return []
        if gone <= self._held.keys():
            holders = self._reread(set().union(*(self._held[owner] for owner in gone)))
        else:
            holders = self._scan()
        if holders is None:
            return []
        self._held = {owner: holders.get(owner, set()) for owner in gone}
        removed = sorted(owner for owner in gone if not self._held[owner])
        if not dry_run:
            for owner_id in removed:
                remove_owner(self._store, owner_id)
                del self._held[owner_id]
        return removed

    def _gone_owners(self) -> set[str]:
        try:
            names = os.listdir(self._store.owners_dir)
        except FileNotFoundError:
            return set()
        here = host_identity()
        gone = set()
        for name in names:
            if not is_valid_session_id(name):
                continue  # a write in progress (``write_atomic``'s temporary), or not ours
            record = read_owner(self._store, name)
            if record is not None and not owner_alive(record, host=here) and owner_gone(record, host=here):
                gone.add(name)
        return gone

    def _scan(self) -> dict[str, set[str]] | None:
        return self._reread(self._store.session_ids())

    def _reread(self, session_ids: Iterable[str]) -> dict[str, set[str]] | None:
        """Owner -> sessions, for every unreleased lease among ``session_ids``; ``None`` if one could not be read."""
        holders: dict[str, set[str]] = {}
        for session_id in session_ids:
            self.leases_read += 1
            try:
                lease = check_lease(self._store, session_id)
            except (SessionNotFoundError, CorruptSessionError):
                continue  # collected meanwhile; or damaged, which proves no holder (``read_lease``)
            except UnavailableSessionError:
                return None
            if lease is not None and lease.state != "released":
                holders.setdefault(lease.owner, set()).add(session_id)
        return holders


def reap_owners(store: Store, *, dry_run: bool = False) -> list[str]:
    """One pass of a new ``OwnerReaper``: what ``store gc`` runs (a full scan whenever some owner is gone)."""
    return OwnerReaper(store).reap(dry_run=dry_run)
