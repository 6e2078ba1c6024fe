"""The store's reserve: space that only ``gc`` spends, so a full disk can still be collected.

``gc`` deletes a session by moving it into a trash folder of its own (an inode
and a block, ``store/retention.py``) and clears index rows with appends: on a
disk with no block or inode left it could do neither, and the one tool that
frees the store's space would refuse to run. So the store keeps
``trash/.reserve``, ``RESERVE_BYTES`` of zeros in one file, made by every
supervisor's start and every ``gc`` that finds the disk with room to spare
(``ROOM_TO_SPARE_BYTES`` free, ``ROOM_TO_SPARE_INODES`` inodes). A ``gc``
that meets a disk with no room removes it (``spend_reserve``): that frees an
inode and 64 blocks, enough for its first trash folders and index appends;
each session it then deletes frees more than its trash folder took (the
folder, the session's file and its companions), so one reserve lets it
collect however much there is. The next start or ``gc`` with room makes it
again, and gc's lock file with it (on a disk with no inode left, the
reserve's one inode must go to gc's first trash folder, not to its lock).

The reserve is made as a session's file is (written unnamed, linked, then
fsync'd, then its folder), so a power loss leaves it whole or absent; its
name starts with a dot, which every reader of ``trash/`` skips.
"""

from __future__ import annotations

import errno
import logging
import os
import stat

from .errors import SubagentError, out_of_room
from .atomic import FILE_MODE, NOFOLLOW, fsync_dir, make_dirs, remove_durably, write_unnamed
from .root import GC_LOCK_NAME, Store

__all__ = ["RESERVE_NAME", "RESERVE_BYTES", "keep_reserve", "spend_reserve", "reserve_path"]

log = logging.getLogger(__name__)

RESERVE_NAME = ".reserve"
RESERVE_BYTES = 256 * 1024
# made only when the disk has this much to spare: the reserve must never be what fills it
ROOM_TO_SPARE_BYTES = 16 * RESERVE_BYTES
ROOM_TO_SPARE_INODES = 64


def reserve_path(store: Store) -> str:
    return os.path.join(store.trash_dir, RESERVE_NAME)


def keep_reserve(store: Store) -> bool:
    """Make the reserve unless it is there or the disk has no room to spare; whether it is there
    now. Never raises: a store it cannot be made in (read-only, full, a folder in the way) goes on
    without one, and a ``gc`` on a full disk then says it found no room, as it would anyway."""
    if (problem := store.trash_problem()) is not None:
        log.warning("the store's reserve for gc was not made: %s", problem)  # never written through a link
        return False
    path = reserve_path(store)
    if os.path.lexists(path):
        return True
    durable = store.durability.syncs_at_commit
    try:
        room = os.statvfs(store.root)
        if room.f_bavail * room.f_frsize < ROOM_TO_SPARE_BYTES or room.f_favail < ROOM_TO_SPARE_INODES:
            return False
        make_dirs(store.trash_dir, durable=durable)
        # gc's lock too, which its first run would make: on a disk with no inode left the reserve's
        # one inode must go to gc's first trash folder
        os.close(os.open(os.path.join(store.trash_dir, GC_LOCK_NAME), os.O_RDWR | os.O_CREAT | NOFOLLOW, FILE_MODE))
        made = write_unnamed(path, bytes(RESERVE_BYTES))
        try:
            made.publish()
            if durable:
                made.sync()  # after the link: it writes the link count (``NewFile``)
                fsync_dir(store.trash_dir)
        finally:
            made.discard()
    except FileExistsError:
        return True  # another supervisor made it meanwhile
    except (OSError, SubagentError) as exc:
        quiet = out_of_room(exc) or (isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES))
        log.log(logging.INFO if quiet else logging.WARNING, "the store's reserve for gc was not made in %s: %s", store.trash_dir, exc)
        return os.path.lexists(path)
    return True


def spend_reserve(store: Store) -> bool:
    """Remove the reserve (durably, as every removal of the store), freeing its space; whether
    there was one. Called by ``gc`` only, under its lock, when the disk has no room left."""
    path = reserve_path(store)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False  # not the reserve: a folder or link of another program, never deleted
    except FileNotFoundError:
        return False
    removed = remove_durably([path], durable=store.durability.syncs_at_commit)
    if removed:
        log.warning("the disk had no room left: gc spent the store's reserve (%d KiB) to go on; the next "
                    "supervisor start or gc with room makes it again", RESERVE_BYTES // 1024)
    return bool(removed)
