"""The store root: its marker, its layout, and where each file of a session lives.

``Store`` is a cheap handle (a path and a durability policy); every process
opens its own. It never caches session state: other processes write the same
files. Every path it builds goes through ``validate_session_id`` first; a
session is one file ``sessions/<id>`` with companion files beside it
(``sessions/<id>.mailbox`` ...), and every reader opens them ``O_NOFOLLOW``:
nothing is read or written through a link planted in the store.

The marker holds the store's ``max_record_bytes``, the one limit every process
on the store writes by (FORMAT.md §2); it is fixed when the store is created.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

import msgpack

from .atomic import make_dirs, read_bytes, write_atomic
from .checkpoints import AppendCheckpoints
from .durability import Durability, durability_policy
from .errors import REFUSED, ReadOnlyStoreError, StoreFormatError, StoreNotFoundError, SubagentError, UnreadableStoreError
from .framing import DEFAULT_RECORD_LIMIT, MAX_RECORD_BYTES, MIN_RECORD_LIMIT
from .ids import is_valid_session_id, validate_session_id

__all__ = ["STORE_FORMAT", "STORE_VERSION", "MIGRATE_HINT", "COMPANIONS", "SET_ASIDE_PREFIX", "Store", "layout_damage", "marker_present", "missing_marker", "read_marker"]

STORE_FORMAT = "subagents-store"
STORE_VERSION = 4
# what a store of an older version (or one whose conversion was interrupted) is told to run
MIGRATE_HINT = "run `subagents store migrate` to convert it"
# the names of folders gc moved aside rather than delete (``Store.set_aside``)
SET_ASIDE_PREFIX = ".foreign."
# gc's lock in ``trash/``: one gc at a time on a store
GC_LOCK_NAME = ".lock"
# the names a session's lazily made companion files take beside its file (``sessions/<id>.<name>``)
COMPANIONS = ("mailbox", "control", "identity")

# What a store folder holds while a creator is between its first sub-folder and its marker
# (or after it died there). Another process opening the store at that moment completes the
# creation (every step is idempotent; the marker is written exclusively) instead of refusing
# "a non-empty folder": several supervisors may start together on a new store.
_LAYOUT = frozenset({"sessions", "owners", "index", "STORE"})

# The folders a store has from its creation (FORMAT.md §1), parents first, and what to do when one is
# gone. None is made again once the marker exists: the marker says the store was complete, so a
# missing ``sessions/`` is sessions lost (an empty folder would pass that off as an empty store), and
# the others were removed by hand, for an operator to look at. The indexes are derived: a reindex
# rebuilds them in a folder made again.
_FOLDERS: tuple[tuple[str, str], ...] = (
    ("sessions", "its sessions are not there; put the folder back (an empty one would hide their loss)"),
    ("owners", "make it again (`mkdir -m 700 {path}`): the supervisors that ran on the store are taken as closed"),
    ("index", "make it again (`mkdir -m 700 {path} {path}/children`) and run `subagents store reindex`"),
    (os.path.join("index", "children"), "make it again (`mkdir -m 700 {path}`) and run `subagents store reindex`"),
)


def _in_the_way(path: str) -> str:
    """What keeps a store from being made at ``path``: the nearest of it and its ancestors that is there
    (a link to nothing counts) and is no folder, said as it is."""
    probe = path
    while probe and not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    probe = probe or path
    if os.path.islink(probe) and not os.path.exists(probe):
        return f"{probe} is a symbolic link to {os.readlink(probe)}, which does not exist"
    return f"{probe} is a file, not a folder"


def _creating(name: str) -> bool:
    return name.startswith(".") or name in _LAYOUT or name.startswith("STORE.tmp.")


def _record_limit_problem(limit: Any) -> str | None:
    """What is wrong with a store's record limit, or None: the one rule for the limit a creator asks for and
    the one a marker holds, so that a limit no creator could set is refused on reading too."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        return "not an integer"
    if limit < MIN_RECORD_LIMIT:
        return f"below the minimum of {MIN_RECORD_LIMIT}"
    if limit > MAX_RECORD_BYTES:
        return f"above the format's ceiling of {MAX_RECORD_BYTES}"
    return None


def _a_file(root: str) -> StoreFormatError:
    return StoreFormatError(f"{root} is a file, not a store folder", path=root)


def missing_marker(root: str) -> StoreFormatError:
    """The error for ``root`` without a ``STORE`` marker, to open without creating.

    Nothing there, an empty folder, or a store still being created (only its
    layout): ``StoreNotFoundError``. A file, or a folder holding anything else,
    exists but is not a store: ``StoreFormatError`` saying what is there.
    """
    if os.path.exists(root) and not os.path.isdir(root):
        return _a_file(root)
    try:
        others = sorted(n for n in os.listdir(root) if not _creating(n))
    except (NotADirectoryError, FileNotFoundError):
        others = []
    if not others:
        return StoreNotFoundError(f"there is no store at {root}", path=root)
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return StoreFormatError(f"{root} is not a store: it holds {shown} and no STORE marker", path=root)


def layout_damage(root: str) -> StoreFormatError | None:
    """The error for the first folder of the layout that is missing or not a folder, or None: the one
    check of every verb, ``store migrate`` too (the layout is the same in every format version).

    Links are followed: a folder moved to another disk and linked back is still the store's. A
    folder this process may not reach is left to the call that needs it to name
    (``STORE_UNREADABLE`` for a reader, ``STORE_READ_ONLY`` for a writer): it is there.
    """
    for name, remedy in _FOLDERS:
        path = os.path.join(root, name)
        try:
            is_folder = stat.S_ISDIR(os.stat(path).st_mode)
        except FileNotFoundError:
            return StoreFormatError(
                f"the store at {root} has no {name}/ folder (moved or deleted?): {remedy.format(path=path)}", path=root,
            )
        except OSError as exc:
            if exc.errno in REFUSED:
                continue
            if exc.errno != errno.ELOOP:
                raise
            is_folder = False  # a link that leads back to itself
        if not is_folder:
            return StoreFormatError(f"the store at {root} is damaged: {path} is not a folder", path=root)
    return None


def _on_read_only_mount(path: str) -> bool:
    """Whether ``path`` lies on a read-only mount; False when it cannot be asked (a folder above it this
    process may not enter: ``statvfs`` is refused there, and it is a permission that keeps the writer out)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError as exc:
        if exc.errno in REFUSED:
            return False
        raise


def marker_present(root: str) -> bool:
    """Whether the marker exists; ``UnreadableStoreError`` when the folder keeps this process out
    (``os.path.exists`` says False then, and another user's store read as "no store here")."""
    try:
        os.stat(os.path.join(root, "STORE"))
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        if exc.errno in REFUSED:
            raise UnreadableStoreError(root, exc) from None
        # anything else in its place (a link loop): there, and ``read_marker`` says what it is
    return True


_MARKER_LIMIT = 64 << 10  # a marker's bytes at most: a map of a few keys is under 100


def read_marker(root: str) -> Any:
    """The decoded ``STORE`` marker of ``root`` (any msgpack value; the caller checks it).

    ``StoreFormatError`` saying what is wrong when it cannot be read or does not
    decode: any garbage in the marker means "not our store". A marker is a small map: one
    larger than ``_MARKER_LIMIT`` is garbage too, refused unread (a stray byte far past its end,
    a sparse GiB, was read whole into memory by every command).
    """
    marker = os.path.join(root, "STORE")
    try:
        raw = read_bytes(marker, stop=lambda _fd: _MARKER_LIMIT + 1)
    except OSError as exc:
        raise StoreFormatError(f"{marker} is unreadable: {exc.strerror or exc}", path=root) from exc
    if not raw:
        raise StoreFormatError(f"{marker} is unreadable: it is empty", path=root)
    if len(raw) > _MARKER_LIMIT:
        raise StoreFormatError(f"{marker} is unreadable: its bytes are not msgpack (more than the {_MARKER_LIMIT} a marker may hold)",
                               path=root)
    try:
        return msgpack.unpackb(raw, raw=False)
    except Exception as exc:  # msgpack raises several kinds, some without a message (FormatError)
        detail = str(exc) or type(exc).__name__
        raise StoreFormatError(f"{marker} is unreadable: its {len(raw)} bytes are not msgpack ({detail})", path=root) from exc


class Store:
    """An opened store folder (created with its ``STORE`` marker when absent)."""

    def __init__(
        self, root: str | os.PathLike[str], *, durability: str | Durability = "batched", create: bool = True,
        max_record_bytes: int | None = None,
    ) -> None:
        """``max_record_bytes`` is used only when this call creates the store; an existing
        store keeps the limit in its marker (every writer of a store must agree)."""
        if not isinstance(root, (str, os.PathLike)):  # ``os.fspath(None)``'s bare TypeError otherwise
            raise SubagentError(f"a store's path must be text or a path, not {type(root).__name__}", code="INVALID_REQUEST")
        self.root = os.path.abspath(os.fspath(root))
        # the folders every session and children-index path starts with, joined once: a listing builds
        # a path or more per child, and ``os.path.join`` cost it ~0.7 µs each
        self._sessions_dir = os.path.join(self.root, "sessions", "")
        self._children_dir = os.path.join(self.root, "index", "children", "")
        self.durability = durability if isinstance(durability, Durability) else durability_policy(durability)
        # where this handle's last append to each shared framed file (children index,
        # mailbox, control) ended; only a hint, bounded (store/checkpoints.py)
        self.index_tails = AppendCheckpoints()
        wrong = None if max_record_bytes is None else _record_limit_problem(max_record_bytes)
        if wrong is not None:
            raise StoreFormatError(f"max_record_bytes {max_record_bytes!r}: {wrong}", path=self.root)
        self.max_record_bytes = DEFAULT_RECORD_LIMIT
        self._open(create, max_record_bytes)

    def _open(self, create: bool, max_record_bytes: int | None) -> None:
        marker = os.path.join(self.root, "STORE")
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise _a_file(self.root)
        if not marker_present(self.root):
            if not create:
                raise missing_marker(self.root)
            if os.path.isdir(self.root) and not all(_creating(n) for n in os.listdir(self.root)):
                raise StoreFormatError(
                    f"{self.root} is not empty and has no STORE marker: refusing to make it a store", path=self.root
                )
            try:
                subs = ("sessions", "owners", os.path.join("index", "children"))
                make_dirs(*(os.path.join(self.root, sub) for sub in subs), durable=self.durability.syncs_at_commit)
            except (NotADirectoryError, FileExistsError) as exc:
                raise StoreFormatError(
                    f"cannot make a store at {self.root}: {_in_the_way(self.root)}", path=self.root
                ) from exc
            except PermissionError as exc:
                raise ReadOnlyStoreError(f"cannot make a store at {self.root}: {exc.strerror}", path=self.root) from exc
            except OSError as exc:
                if exc.errno != errno.EROFS:
                    raise
                raise ReadOnlyStoreError(f"cannot make a store at {self.root}: {exc.strerror}", path=self.root) from exc
            try:
                info = {"format": STORE_FORMAT, "version": STORE_VERSION, "max_record_bytes": max_record_bytes or DEFAULT_RECORD_LIMIT}
                write_atomic(marker, msgpack.packb(info), durable=True, exclusive=True)
            except FileExistsError:
                pass  # another process created it at the same time
        info = read_marker(self.root)
        if not isinstance(info, dict) or info.get("format") != STORE_FORMAT:
            raise StoreFormatError(f"{self.root} holds format {info!r}, not a {STORE_FORMAT}", path=self.root)
        if info.get("migrating") is not None:
            raise StoreFormatError(
                f"{self.root} was being converted to version {info.get('migrating')!r} when the conversion stopped: "
                f"run `subagents store migrate` to finish it", path=self.root,
            )
        version = info.get("version")
        if version != STORE_VERSION:
            hint = f": {MIGRATE_HINT}" if isinstance(version, int) and not isinstance(version, bool) and version < STORE_VERSION else ""
            raise StoreFormatError(
                f"{self.root} is a {STORE_FORMAT} of version {version!r}; this build reads version {STORE_VERSION}{hint}",
                path=self.root,
            )
        limit = info.get("max_record_bytes", DEFAULT_RECORD_LIMIT)  # absent in markers written before the limit
        wrong = _record_limit_problem(limit)
        if wrong is not None:
            raise StoreFormatError(f"{marker} holds max_record_bytes {limit!r}: {wrong}", path=self.root)
        self.max_record_bytes = limit
        damaged = layout_damage(self.root)
        if damaged is not None:
            raise damaged

    def require_writable(self, *also: str) -> None:
        """``ReadOnlyStoreError`` unless this process may write the folders every writer touches,
        and the files or folders ``also`` names that exist (``gc``: the indexes it must update).

        Checked by callers that are about to write (the CLI's writing verbs), so a
        read-only store is named as such before anything starts. ``os.access``
        answers for the real user and sees read-only mounts and immutable folders,
        which root's permission bypass does not; not guaranteed: a store that turns
        read-only afterwards fails at its next write instead.
        """
        damaged = layout_damage(self.root)  # removed since the store was opened: named, not a bare FileNotFoundError
        if damaged is not None:
            raise damaged
        present = [p for p in also if os.path.lexists(p)]
        for path in (self.root, self.sessions_dir, self.owners_dir, self.index_dir, self.children_index_dir, *present):
            if not os.access(path, os.W_OK | (os.X_OK if os.path.isdir(path) else 0)):
                why = "a read-only file system" if _on_read_only_mount(path) else f"no write permission on {path}"
                raise ReadOnlyStoreError(f"the store at {self.root} is read-only ({why})", path=self.root)

    # -- layout --------------------------------------------------------------

    @property
    def sessions_dir(self) -> str:
        return os.path.join(self.root, "sessions")

    @property
    def owners_dir(self) -> str:
        return os.path.join(self.root, "owners")

    @property
    def index_dir(self) -> str:
        """``index/``: the roots index, and the folder of the children indexes."""
        return os.path.join(self.root, "index")

    @property
    def children_index_dir(self) -> str:
        return os.path.join(self.root, "index", "children")

    @property
    def trash_dir(self) -> str:
        """``trash/``: session folders ``gc`` removed (renamed here, then deleted); readers never look in it."""
        return os.path.join(self.root, "trash")

    def trash_problem(self) -> str | None:
        """What makes ``trash/`` no folder of the store's own (a symbolic link, a file), or None (a folder,
        or not made yet). gc deletes what it finds there: unlike the other layout folders, which may be
        links to where they were moved, a link here would have it empty another program's folder."""
        try:
            mode = os.lstat(self.trash_dir).st_mode
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in REFUSED:
                return None  # there: the call that needs it names what keeps it out
            raise
        if stat.S_ISDIR(mode):
            return None
        if stat.S_ISLNK(mode):
            try:
                target = os.readlink(self.trash_dir)
            except OSError:
                target = "?"
            return f"{self.trash_dir} is a symbolic link (to {target}), not the store's own folder"
        return f"{self.trash_dir} is not a folder"

    def in_trash(self, session_id: str) -> bool:
        """Whether a folder of ``session_id`` waits in ``trash/`` (``<id>.<hex>``): an interrupted ``gc``."""
        try:
            names = os.listdir(self.trash_dir)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return any(name.partition(".")[0] == session_id for name in names if not name.startswith("."))

    def set_aside(self) -> list[str]:
        """The names in ``trash/`` of folders gc found where it was about to delete and moved aside
        (``trash/.foreign.<name>.<hex>``, ``store/retention.py``): another program's, for an
        operator to look at. No gc lists or deletes them; ``fsck`` and ``check`` report them."""
        try:
            names = os.listdir(self.trash_dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(name for name in names if name.startswith(SET_ASIDE_PREFIX))

    def session_path(self, session_id: str) -> str:
        """``sessions/<id>``: the session's one file (``store/session_file.py``).

        Opened with ``O_NOFOLLOW`` by every reader and writer: a link planted in
        its place is refused (``UnavailableSessionError``), never followed.
        """
        return self._sessions_dir + validate_session_id(session_id)

    def path(self, session_id: str, name: str) -> str:
        """``sessions/<id>.<name>``: a companion file of the session (mailbox, control, identity),
        made when first needed; absent for most sessions."""
        if name not in COMPANIONS:
            raise ValueError(f"{name!r} is not a companion file of a session (one of {', '.join(COMPANIONS)})")
        return f"{self._sessions_dir}{validate_session_id(session_id)}.{name}"

    def owner_path(self, owner_id: str) -> str:
        return os.path.join(self.root, "owners", validate_session_id(owner_id))

    def children_index_path(self, parent_id: str) -> str:
        return self._children_dir + validate_session_id(parent_id)

    @property
    def roots_index_path(self) -> str:
        return os.path.join(self.root, "index", "roots")

    def require_index_files(self, *paths: str) -> None:
        """``StoreFormatError`` for an index path of these that exists and is no regular file (a folder,
        a link): an index is replaced by a rename and appended in place, which a folder there refuses
        only after the writer began (``gc`` had moved the sessions it collects to its trash), and
        its error named the index as a session. Checked before a writer that rewrites indexes begins."""
        for path in paths:
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(mode):
                what = "a folder" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode) else "no regular file"
                raise StoreFormatError(
                    f"{os.path.relpath(path, self.root)} in the store at {self.root} is {what}, not the index file the store keeps "
                    "there: move it out of the store, then run `subagents store reindex`", path=path,
                )

    def exists(self, session_id: str) -> bool:
        """Whether ``sessions/<id>`` exists (a session is published exactly when its file is)."""
        return os.path.lexists(self.session_path(session_id))

    def session_ids(self, *, any_type: bool = False) -> list[str]:
        """Every published session, sorted (ids are time-ordered). Names with a dot are companion
        files or a creation's temporary file, never a session, and neither is any other name that
        is not a valid id (``subagents store fsck`` reports those); a link in a session's place is
        left out. ``any_type``: a folder, a link or a FIFO named by an id is listed too, for the
        checks that must report it as a damaged session (listings show it as a diagnostic)."""
        found = []
        try:
            with os.scandir(self.sessions_dir) as entries:
                for entry in entries:
                    if is_valid_session_id(entry.name) and (any_type or entry.is_file(follow_symlinks=False)):
                        found.append(entry.name)
        except PermissionError as exc:  # a folder this process may enter and not list: no reader can go on
            raise UnreadableStoreError.of(self.root, exc) from None
        except FileNotFoundError:  # removed since the store was opened (``top`` lists again and again): named
            damaged = layout_damage(self.root)
            if damaged is None:
                raise
            raise damaged from None
        return sorted(found)

    def __repr__(self) -> str:
        return f"Store({self.root!r}, durability={self.durability.name!r})"
