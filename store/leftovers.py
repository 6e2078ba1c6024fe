"""Temporary names of writes a kill interrupted: found for ``fsck`` and ``check``, removed by ``gc``.

A file the store replaces whole (a children index ``reindex`` rewrites,
``index/roots`` after a gc, an owner record, the ``STORE`` marker) is written
under ``<name>.tmp.<pid>.<hex>`` and renamed over the old one; where the
system has no unnamed files, a session is created under
``.<id>.new.<pid>.<hex>`` (``store/atomic.py``). A process killed between
the write and the rename leaves that name, and nothing else ever removes it:
every reader skips it, so it costs only an inode and its bytes, but they
add up over a store's life of crashes.

A leftover is removed only when no write can still be under way: the name
is older than ``LEFTOVER_AGE_S`` (such a write is one write and one fsync)
and its pid (in the name) runs no process on this host. A writer stopped
between its write and its rename (a debugger, ``SIGSTOP``) renames when it
wakes, so its name stays while it lives; a writer on another host sharing
the store is covered by the age alone. Only names of exactly those shapes,
and only regular files directly in the store's own folders, are touched.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass

from .atomic import remove_durably, temporary_writer
from .lease import process_start_time
from .root import Store

__all__ = ["LEFTOVER_AGE_S", "Leftover", "find_leftovers", "remove_leftovers"]

log = logging.getLogger(__name__)

# no write under way keeps its temporary name this long: it is one write and one fsync
LEFTOVER_AGE_S = 60.0


@dataclass(frozen=True)
class Leftover:
    """A temporary name a write left, and whether ``gc`` may remove it now."""

    path: str
    name: str  # relative to the store's folder, as ``fsck`` reports it
    pid: int  # the writer's, from the name
    age_s: float
    removable: bool  # old enough, and its writer runs no process here


def find_leftovers(store: Store, *, now: float | None = None, sessions: bool = True) -> list[Leftover]:
    """Every temporary name of a write in the store's own folders, oldest first. ``sessions=False``
    leaves out ``sessions/`` (its listing is the longest), for a caller that reads its names itself."""
    now = time.time() if now is None else now
    found: list[Leftover] = []
    folders = (store.root, store.sessions_dir, store.index_dir, store.children_index_dir, store.owners_dir)
    for folder in folders if sessions else tuple(f for f in folders if f != store.sessions_dir):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # absent or unreadable: what reads it reports that
        for entry in entries:
            pid = temporary_writer(entry.name)
            if pid is None:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # renamed or removed since the listing: a write that ended
            if not stat.S_ISREG(info.st_mode):
                continue
            age = now - info.st_mtime
            removable = age >= LEFTOVER_AGE_S and process_start_time(pid) is None
            found.append(Leftover(entry.path, os.path.relpath(entry.path, store.root), pid, age, removable))
    found.sort(key=lambda one: (-one.age_s, one.name))
    return found


def remove_leftovers(store: Store, *, dry_run: bool = False) -> int:
    """Remove the leftovers no write can still use (durably, as every removal of the store's names:
    a name that came back after a power loss could name a file made since); how many (``dry_run``:
    that would go)."""
    gone = [one for one in find_leftovers(store) if one.removable]
    if dry_run or not gone:
        return len(gone)
    removed = remove_durably([one.path for one in gone], durable=store.durability.syncs_at_commit, ignore_errors=True)
    log.info("removed %d temporary file(s) of writes a kill interrupted: %s", removed, ", ".join(one.name for one in gone))
    return removed
