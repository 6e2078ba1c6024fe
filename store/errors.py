"""Errors of the store, and the root of every error the project raises.

Hierarchy (each class has a stable ``code``; callers branch on the class or
the code, never on the message)::

    SubagentError                       root of every error of the service
    ├── InvalidSessionIdError           bad input: id syntax (also ValueError)
    ├── InvalidHeaderError              bad input: header breaks the rules (also ValueError)
    ├── StoreFormatError                the folder is not a store of our format/version
    │   └── StoreNotFoundError          there is no store at that path (also FileNotFoundError)
    ├── ReadOnlyStoreError              the store cannot be written by this process (also PermissionError)
    ├── UnreadableStoreError            the store's folder cannot be entered by this process (also PermissionError)
    ├── SessionNotFoundError            no such session (also LookupError)
    │   └── AmbiguousIdError            bad input: an id prefix that names several sessions
    ├── InvalidQueryError               bad input: a listing's filter, sort, limit or cursor (also ValueError)
    ├── SessionExistsError              creation of an id that exists
    ├── CorruptSessionError             committed bytes are damaged
    ├── UnavailableSessionError         a session file cannot be read at all (also OSError)
    ├── RecordTooLargeError             bad input: a record above the store's size limit (also ValueError)
    ├── OutOfMemoryError                no memory to frame a record; nothing written (also MemoryError)
    ├── UnsupportedFormatError          written by a newer/other format
    ├── FencedError                     a newer lease epoch took the session over
    ├── DurabilityError                 fsync/write failed: fatal for that session (also OSError)
    ├── LeaseHeldError                  a live owner holds the lease
    ├── LockTimeoutError                a session lock stayed held past its timeout (also TimeoutError)
    └── DescriptorError                 a persisted descriptor fails validation

Errors cross the worker pipe as data (``to_wire``/``from_wire``) and are
rebuilt as the same class, so every subclass keeps its fields in ``fields``.
"""

from __future__ import annotations

import errno
import importlib
import sys
from typing import Any, ClassVar

__all__ = [
    "SubagentError",
    "InvalidSessionIdError",
    "InvalidHeaderError",
    "StoreFormatError",
    "StoreNotFoundError",
    "ReadOnlyStoreError",
    "REFUSED",
    "UnreadableStoreError",
    "SessionNotFoundError",
    "AmbiguousIdError",
    "InvalidQueryError",
    "SessionExistsError",
    "CorruptSessionError",
    "UnavailableSessionError",
    "RecordTooLargeError",
    "OutOfMemoryError",
    "UnsupportedFormatError",
    "FencedError",
    "DurabilityError",
    "NoRoomError",
    "out_of_room",
    "write_failed",
    "LeaseHeldError",
    "LockTimeoutError",
    "DescriptorError",
    "error_registry",
]


class SubagentError(Exception):
    """Raised for every failure the service can name; ``code`` is stable."""

    code: ClassVar[str] = "SUBAGENT_ERROR"
    # Instances may override the class code (the reference uses one class with
    # many codes); ``self.code`` is what callers read.

    def __init__(self, message: str, *, code: str | None = None, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code  # type: ignore[misc]
        self.fields: dict[str, Any] = dict(fields)
        for key, value in fields.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self).__qualname__, type(self).__module__, self.to_wire()))

    def to_wire(self) -> dict[str, Any]:
        """The error as plain data, for the worker pipe."""
        return {
            "class": type(self).__qualname__,
            "module": type(self).__module__,
            "code": self.code,
            "message": self.message,
            "fields": _plain(self.fields),
        }

    def __str__(self) -> str:
        return self.message


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, (str, int, float, bool, type(None))):
            out[key] = value
        elif isinstance(value, (list, tuple)):
            out[key] = [v if isinstance(v, (str, int, float, bool, type(None))) else str(v) for v in value]
        else:
            out[key] = str(value)
    return out


def error_registry() -> dict[str, type[SubagentError]]:
    """Every loaded SubagentError subclass by ``module.qualname``."""
    found: dict[str, type[SubagentError]] = {}
    stack: list[type[SubagentError]] = [SubagentError]
    while stack:
        cls = stack.pop()
        found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        stack.extend(cls.__subclasses__())
    return found


# the package whose modules a wire may name (``subagents.``): the rooms install under it
_PACKAGE = __name__.split(".")[0] + "."


def _class_of(module: Any, name: Any) -> type[SubagentError]:
    """The class the wire names. One of this package's modules not loaded yet is imported, as
    pickle imports the module a class names: a worker that never imported the supervisor's errors
    would otherwise rebuild them as the root class, and ``except PermissionError`` would miss an
    ``UNAUTHORIZED`` that the same code on the host catches. Anything else unknown is the root."""
    key = f"{module}.{name}"
    cls = error_registry().get(key)
    if cls is None and isinstance(module, str) and module.startswith(_PACKAGE) and module not in sys.modules:
        try:
            importlib.import_module(module)
        except ImportError:
            return SubagentError
        cls = error_registry().get(key)
    return cls or SubagentError


def from_wire(data: dict[str, Any]) -> SubagentError:
    """Rebuild an error sent by ``to_wire`` as its own class (``_class_of``); unknown classes become the root."""
    cls = _class_of(data.get("module"), data.get("class"))
    err = cls.__new__(cls)
    SubagentError.__init__(err, str(data.get("message", "")), code=data.get("code"), **dict(data.get("fields") or {}))
    return err


def _rebuild(qualname: str, module: str, wire: dict[str, Any]) -> SubagentError:
    return from_wire(wire)


class InvalidSessionIdError(SubagentError, ValueError):
    """Raised when a session id breaks ``^[0-9A-Za-z][0-9A-Za-z_-]{0,63}$``, before any path is built."""

    code = "INVALID_SESSION_ID"

    def __init__(self, session_id: object) -> None:
        shown = _shown(session_id)
        super().__init__(f"invalid session id {shown}", session_id=shown)


# an id is echoed back in messages: a bad one may be any length (a 5,000-character argument)
_SHOWN_ID_CHARS = 80


def _shown(value: object) -> str:
    """``repr(value)``, cut to a readable length with the full length said."""
    text = repr(value)
    if len(text) <= _SHOWN_ID_CHARS:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, (str, bytes)) else ""
    return text[: _SHOWN_ID_CHARS - 1] + "…" + size


class InvalidHeaderError(SubagentError, ValueError):
    """Raised when a session header breaks the rules of FORMAT.md on write."""

    code = "INVALID_HEADER"


class StoreFormatError(SubagentError):
    """Raised when a folder is not a subagents store of a version this build reads."""

    code = "STORE_FORMAT"


class StoreNotFoundError(StoreFormatError, FileNotFoundError):
    """Raised when a store is opened without creating it and the path holds no store (no ``STORE`` marker)."""

    code = "STORE_NOT_FOUND"


# what the kernel answers a process the file's mode, its owner or a read-only mount turns away
REFUSED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


class ReadOnlyStoreError(SubagentError, PermissionError):
    """Raised when a process that must write to a store cannot (a read-only mount, missing write permission)."""

    code = "STORE_READ_ONLY"

    @classmethod
    def cannot_write(cls, session_id: str, what: str, exc: OSError) -> "ReadOnlyStoreError":
        """A file of a session this process may read and not write (another user's, a read-only mount): a
        refused write, not a file that no longer reads (``UnavailableSessionError``)."""
        return cls(f"{what} cannot be written by this process ({exc.strerror or exc})", session_id=session_id)


class UnreadableStoreError(SubagentError, PermissionError):
    """Raised when a store's folder cannot be entered by this process (another user's store, a folder that
    lists but does not let its files be opened): nothing of it can be read, so it is not called another format."""

    code = "STORE_UNREADABLE"

    def __init__(self, root: str, exc: OSError) -> None:
        where = f": {exc.filename}" if exc.filename is not None and str(exc.filename) != str(root) else ""
        super().__init__(f"the store at {root} cannot be read by this process ({exc.strerror or exc}{where})", path=root)

    @classmethod
    def of(cls, root: str, exc: OSError) -> OSError:
        """What to raise for ``exc``: this error for what the kernel turned away (``REFUSED``), else ``exc``."""
        return cls(root, exc) if exc.errno in REFUSED else exc


class SessionNotFoundError(SubagentError, LookupError):
    """Raised when a session id has no header in the store."""

    code = "SESSION_NOT_FOUND"

    def __init__(self, session_id: str) -> None:
        super().__init__(f'session "{session_id}" not found', session_id=session_id)


class AmbiguousIdError(SessionNotFoundError):
    """Raised when an id prefix typed by a user starts more than one session id (``store/prefix.py``)."""

    code = "AMBIGUOUS_ID"

    def __init__(self, prefix: str, matches: list[str]) -> None:
        shown = ", ".join(matches[:5]) + (", …" if len(matches) > 5 else "")
        SubagentError.__init__(self, f'"{prefix}" starts {len(matches)} session ids ({shown}); type more of it',
                               session_id=prefix, matches=matches[:5])


class InvalidQueryError(SubagentError, ValueError):
    """Raised when a listing's filter, sort, limit or cursor is not one this build understands (``store/query.py``)."""

    code = "INVALID_QUERY"


class SessionExistsError(SubagentError):
    """Raised when creating a session whose id is already on disk."""

    code = "SESSION_EXISTS"

    def __init__(self, session_id: str) -> None:
        super().__init__(f'session "{session_id}" already exists', session_id=session_id)


class CorruptSessionError(SubagentError):
    """Raised when committed bytes of a session are damaged (never repaired silently)."""

    code = "CORRUPT_SESSION"

    def __init__(self, session_id: str, reason: str, *, offset: int | None = None) -> None:
        super().__init__(
            f'stored session "{session_id}" failed validation: {reason}',
            session_id=session_id,
            reason=reason,
            offset=offset,
        )


class UnavailableSessionError(SubagentError, OSError):
    """Raised when a file of a session cannot be read at all: a folder or a link in
    place of the file, a link loop, no permission. Listings show it as ``unavailable``."""

    code = "SESSION_UNAVAILABLE"

    def __init__(self, session_id: str, reason: str, *, out_of_descriptors: bool = False) -> None:
        # ``out_of_descriptors``: this process (or the system) had no file descriptor left to open it with
        # (``EMFILE``, ``ENFILE``): the session's files are not at fault, and a later try may succeed
        super().__init__(f'stored session "{session_id}" is unavailable: {reason}', session_id=session_id, reason=reason,
                         **({"out_of_descriptors": True} if out_of_descriptors else {}))

    @classmethod
    def of(cls, session_id: str, what: str, exc: OSError) -> "UnavailableSessionError":
        """``what`` (``"its log cannot be read"``) failed with ``exc``: the error, saying whether descriptors ran out."""
        return cls(session_id, f"{what} ({exc.strerror or exc})", out_of_descriptors=exc.errno in OUT_OF_DESCRIPTORS)


class RecordTooLargeError(SubagentError, ValueError):
    """Raised before anything is written when one record (a message, an event, a control
    request) would frame to more bytes than the store's ``max_record_bytes``.

    ``event``: the type of the log event refused (``"tool/call"``), absent for a record that is no
    event; a program that answers some refusals (the ``llm`` program a model's call too large to log)
    matches on it and the code, never on ``what``, which is words for people."""

    code = "RECORD_TOO_LARGE"

    def __init__(self, what: str, *, size: int, limit: int, code: str | None = None, event: str | None = None) -> None:
        super().__init__(
            f"{what} of {size} bytes exceeds the store's record size limit of {limit} bytes (max_record_bytes)",
            code=code, what=what, size=size, limit=limit, **({"event": event} if event is not None else {}),
        )


class OutOfMemoryError(SubagentError, MemoryError):
    """Raised before anything is written when the process has no memory to frame one record (a record is
    framed whole before a byte of it is written): its address-space limit (``ulimit -v``) or the machine's
    memory, short of a few times the record's size. Nothing was stored; the same call with more memory, or a
    smaller message, works. Also a ``MemoryError``, which is what the interpreter raised."""

    code = "OUT_OF_MEMORY"

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} could not be framed: this process ran out of memory (its address-space limit, "
                         "ulimit -v, or the machine's); nothing was written", what=what)


class InvalidRecordError(SubagentError, ValueError):
    """Raised before anything is written when a record cannot be stored: a value msgpack cannot encode
    (an object, a lone surrogate, an integer beyond 64 bits), or a field its readers would refuse
    (a message whose ``source`` is not a map), which would read back as damage."""

    code = "INVALID_RECORD"

    def __init__(self, what: str, problem: str) -> None:
        super().__init__(f"{what} cannot be stored: {problem}", what=what, problem=problem)

    @classmethod
    def unencodable(cls, what: str, exc: Exception) -> "InvalidRecordError":
        """What msgpack raised for a value it cannot encode."""
        return cls(what, f"{type(exc).__name__}: {exc}")


class UnsupportedFormatError(SubagentError):
    """Raised when a record or file was written by a format this build does not read."""

    code = "UNSUPPORTED_FORMAT"


class FencedError(SubagentError):
    """Raised when a writer's lease epoch is no longer the session's: someone took it over.

    A fenced writer must drop the session; it can never write again.
    """

    code = "FENCED"

    def __init__(self, session_id: str, *, epoch: int, current_epoch: int | None, lease: str | None = None) -> None:
        """``current_epoch``: the epoch a writer must match now, None when none may write; ``lease``: what the
        lease reads as, when that is not one epoch (``epoch 2, released``: "lease epoch None" said nothing)."""
        super().__init__(
            f'session "{session_id}" was taken over: writer epoch {epoch}, lease {lease or f"epoch {current_epoch}"}',
            session_id=session_id,
            epoch=epoch,
            current_epoch=current_epoch,
        )


# the errnos of a file system with no room left (no block, no inode, over quota, or a file at its
# size limit): the disk refused, nothing of the store's is damaged or in the way
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# no file descriptor left, in this process or the system: nothing wrong with the file being opened
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
# what an error for want of a descriptor tells its reader to do (a creation's, a worker start's)
NO_DESCRIPTOR_LEFT = "this process has no file descriptor left: raise its open-file limit, ulimit -n"


class DurabilityError(SubagentError, OSError):
    """Raised when a write or fsync failed; the session is unusable for that writer.

    A failed fsync is never retried: the kernel may have dropped the dirty
    pages, so a later fsync that succeeds would report a false success.
    """

    code = "DURABILITY_FAILED"


class NoRoomError(DurabilityError):
    """A write the disk had no room for (``NO_ROOM``, or a short write), cut back: nothing of it was
    written, so unlike a failed fsync it may be tried again once there is room (``gc`` does)."""


def write_failed(message: str, exc: OSError, **fields: Any) -> DurabilityError:
    """The error of a write the OS refused (``exc``): ``NoRoomError`` when the disk had no room
    (``NO_ROOM``), else ``DurabilityError``."""
    return (NoRoomError if exc.errno in NO_ROOM else DurabilityError)(message, **fields)


def out_of_room(exc: BaseException) -> bool:
    """Whether ``exc`` is the disk having no room for a write that left nothing behind: a
    ``NoRoomError``, or the OS's own error of a call that makes a name or an inode (``mkdir``,
    ``open`` with ``O_CREAT``). Never a failed fsync, which is not to be tried again."""
    if isinstance(exc, NoRoomError):
        return True
    return isinstance(exc, OSError) and not isinstance(exc, SubagentError) and exc.errno in NO_ROOM


class LeaseHeldError(SubagentError):
    """Raised when a session's lease is held by another live owner."""

    code = "LEASE_HELD"

    def __init__(self, session_id: str, *, owner: str, epoch: int) -> None:
        super().__init__(
            f'session "{session_id}" is leased by live owner {owner} (epoch {epoch})',
            session_id=session_id,
            owner=owner,
            epoch=epoch,
        )


class LockTimeoutError(SubagentError, TimeoutError):
    """Raised when a lock file stayed held past ``LOCK_TIMEOUT_S``.

    The holder is stuck inside a critical section (stopped, hung, or on a
    file system where ``flock`` misbehaves); ``flock`` cannot be broken from
    outside, so the caller must wait for the holder to be resumed or killed.
    """

    code = "LOCK_TIMEOUT"

    def __init__(self, path: str) -> None:
        super().__init__(f"lock {path} is still held after its timeout", path=path)


class DescriptorError(SubagentError, ValueError):
    """Raised when a persisted subagent descriptor fails validation."""

    code = "INVALID_DESCRIPTOR"
