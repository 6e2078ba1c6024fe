"""Removing the records crashed supervisors left in ``owners/``.

A record is removed once its owner is gone for good (``owner_gone``) and no
unreleased lease names it. A live owner's record is its proof of life, and a
dead owner's record that a lease still names is how ``check_store`` tells a
crashed holder (harmless) from one that closed without releasing.

Knowing that no lease names an owner costs a read of every session's lease.
A gone owner never writes again, so the leases naming it only move away from
it (a takeover, a collected session): once a complete scan has found where
they are, a later pass need only read those again. ``OwnerReaper`` keeps that
finding in memory (a supervisor keeps one reaper: its pass at open reads, its
pass at close reads the few leases the first found) and leaves it beside the
record, ``owners/<id>.held`` (the session ids, msgpack; not durable: a hint),
so a new process reads those leases too instead of every session's. A hint is
only ever written from a complete scan made once the owner was gone, or from
a narrowing of one, so it lists every lease that can still name its owner. A
hint that does not read is ignored (a complete scan), and goes with its
record; one whose record is gone is removed.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable

import msgpack

from .atomic import read_bytes, write_atomic
from .errors import CorruptSessionError, SessionNotFoundError, UnavailableSessionError
from .ids import is_valid_session_id
from .lease import check_lease, host_identity, owner_alive, owner_gone, read_owner, remove_owner
from .records import unpack
from .root import Store

__all__ = ["OwnerReaper", "reap_owners", "read_hint"]

log = logging.getLogger(__name__)


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
        gone = self._gone_owners(dry_run)
        self._held = {owner: sessions for owner, sessions in self._held.items() if owner in gone}
        if not gone:
            return []
        for owner in gone - self._held.keys():
            hint = read_hint(self._store, owner)
            if hint is not None:
                self._held[owner] = hint
        if gone <= self._held.keys():
            holders = self._reread(set().union(*(self._held[owner] for owner in gone)))
        else:
            holders = self._scan()
        if holders is None:
            return []
        found = {owner: holders.get(owner, set()) for owner in gone}
        removed = sorted(owner for owner in gone if not found[owner])
        if not dry_run:
            for owner_id in gone - set(removed):
                if found[owner_id] != self._held.get(owner_id):
                    write_hint(self._store, owner_id, found[owner_id])
            for owner_id in removed:
                remove_owner(self._store, owner_id)
                remove_hint(self._store, owner_id)
        self._held = {owner: sessions for owner, sessions in found.items() if dry_run or owner not in removed}
        return removed

    def _gone_owners(self, dry_run: bool) -> set[str]:
        """The owners gone for good; and (not ``dry_run``) the hints whose record is gone, removed."""
        try:
            names = set(os.listdir(self._store.owners_dir))
        except FileNotFoundError:
            return set()
        here = host_identity()
        gone = set()
        for name in names:
            owner, dot, kind = name.partition(".")
            if dot and kind == HINT and is_valid_session_id(owner) and owner not in names and not dry_run:
                remove_hint(self._store, owner)  # its record went (a reaper that raced ours wrote it after)
            if not is_valid_session_id(name):
                continue  # a hint, a write in progress (``write_atomic``'s temporary), or not ours
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


HINT = "held"  # ``owners/<id>.held``


def _hint_path(store: Store, owner_id: str) -> str:
    return f"{store.owner_path(owner_id)}.{HINT}"


def read_hint(store: Store, owner_id: str) -> set[str] | None:
    """The sessions a hint says may still name ``owner_id``; ``None`` when there is none or it does not read."""
    try:
        value = unpack(read_bytes(_hint_path(store, owner_id)))
    except (OSError, ValueError):
        return None
    if not isinstance(value, list) or not all(isinstance(one, str) and is_valid_session_id(one) for one in value):
        return None
    return set(value)


def write_hint(store: Store, owner_id: str, sessions: set[str]) -> None:
    """Best effort: a hint that is not written costs a later process a complete scan, nothing else."""
    try:
        write_atomic(_hint_path(store, owner_id), msgpack.packb(sorted(sessions)), durable=False)
    except OSError:
        log.debug("could not write the lease hint of owner %s", owner_id, exc_info=True)


def remove_hint(store: Store, owner_id: str) -> None:
    """Best effort, as writing one is: a hint left in place (a folder where it was, a file the process
    may not remove) is one a reader ignores or rescans past, and fails no pass that meets it."""
    try:
        os.unlink(_hint_path(store, owner_id))
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove the lease hint of owner %s (%s); it is left in place", owner_id, exc.strerror or exc)


def reap_owners(store: Store, *, dry_run: bool = False) -> list[str]:
    """One pass of a new ``OwnerReaper``: what ``store gc`` runs (a full scan whenever some owner is gone)."""
    return OwnerReaper(store).reap(dry_run=dry_run)
