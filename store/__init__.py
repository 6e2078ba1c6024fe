"""The durable store: one folder of msgpack files shared by every process.

General layout (read ``FORMAT.md`` for the bytes):

* ``root``        — the ``Store`` handle, its marker and its paths;
* ``framing``     — the record format every append-only file uses;
* ``header`` / ``session`` — immutable session headers, creation and rollback;
* ``log`` / ``reader`` — the fenced writer (and the only repair path) and
  the read-only inspection;
* ``projection`` / ``descriptor`` — identity, timing and resume state folded
  from a log, cached in ``identity``;
* ``lease`` / ``locks`` — owners, heartbeats, fenced leases, session locks;
* ``mailbox``     — durable accepted messages;
* ``records``     — the typed check of every decoded record (damage is a value);
* ``index`` / ``catalog`` — the derived children index and the listings;
* ``roots`` / ``held`` / ``description`` / ``tail`` — the read-only views the
  CLI prints: top-level sessions, held sessions, one session, a growing log;
* ``check``       — every invariant of a store, checked while others write;
* ``retention``   — ``collect``: old, settled top-level subtrees deleted (``gc``).

This package imports neither ``worker`` nor ``supervisor``.

The names resolve on first use (PEP 562): importing one module of this package
(``subagents.store.errors``, the read path of a listing) runs this file, and
loading every module here would cost a short command such as ``subagents ls``
the whole store, ``check`` and ``retention`` included. ``_EXPORTS`` says where
each name lives; the ``TYPE_CHECKING`` imports say the same to type checkers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from subagents.exports import lazy_exports

if TYPE_CHECKING:
    from .check import CheckCounts, CheckReport, Violation, check_store
    from .catalog import ChildEntry, DescendantRow, DiagnosticEntry, Identity, list_children, list_descendants, read_identity
    from .control import ControlRecord, control_size, read_controls, request
    from .description import MailboxCounts, SessionDescription, describe_session, mailbox_counts
    from .descriptor import (
        DESCRIPTOR_VERSION,
        ContinuableDescriptor,
        Descriptor,
        OneShotDescriptor,
        ToolFilter,
        fold_resume_descriptor,
        parse_descriptor,
    )
    from .durability import Durability, durability_policy
    from .errors import (
        CorruptSessionError,
        DescriptorError,
        DurabilityError,
        FencedError,
        InvalidHeaderError,
        InvalidSessionIdError,
        LeaseHeldError,
        LockTimeoutError,
        InvalidRecordError,
        RecordTooLargeError,
        OutOfMemoryError,
        ReadOnlyStoreError,
        UnreadableStoreError,
        SessionExistsError,
        SessionNotFoundError,
        AmbiguousIdError,
        InvalidQueryError,
        StoreFormatError,
        StoreNotFoundError,
        SubagentError,
        UnavailableSessionError,
        UnsupportedFormatError,
    )
    from .events import EVENT_TYPES, closers
    from .framing import MAX_RECORD_BYTES, Damage, ScanResult, encode_record, scan
    from .header import SessionHeader, parse_header
    from .held import HeldSession, held_sessions
    from .ids import IdGenerator, is_valid_session_id, new_id, validate_session_id
    from .index import IndexEntry, IndexRead, ReindexReport, add_child, read_children, read_index, reindex
    from .lease import (
        Lease,
        OwnerCache,
        OwnerRecord,
        acquire_lease,
        check_lease,
        heartbeat,
        maintenance_owner,
        owner_alive,
        owner_gone,
        read_lease,
        read_owner,
        register_owner,
        release_lease,
        remove_owner,
        session_status,
        set_lease_state,
    )
    from .log import LogWriter, SeqMismatchError, load_projection, read_projection
    from .mailbox import accept
    from .mailbox_read import MailboxMessage, pending, read_mailbox
    from .outcome import OUTCOMES, OutcomeVerdict, outcome_of
    from .prefix import MIN_PREFIX, resolve_id, short_ids
    from .projection import Projection, Timing
    from .reaper import OwnerReaper, reap_owners
    from .reader import Inspection, inspect, read_from, read_header
    from .root import STORE_FORMAT, STORE_VERSION, Store
    from .query import Page, Query
    from .retention import CollectedRoot, GcReport, SkippedRoot, collect, parse_age
    from .roots import DEFAULT_ROOT_LIMIT, RootEntry, find_roots, list_roots, rebuild_roots, subagent_count
    from .session import create_session, delete_session
    from .summary import Summary, SupervisorCount, summarize
    from .tail import LogTail

# module -> the names it gives this package
_EXPORTS: dict[str, tuple[str, ...]] = {
    ".check": ("CheckCounts", "CheckReport", "Violation", "check_store"),
    ".catalog": (
        "ChildEntry", "DescendantRow", "DiagnosticEntry", "Identity", "list_children", "list_descendants",
        "read_identity",
    ),
    ".control": ("ControlRecord", "control_size", "read_controls", "request"),
    ".description": ("MailboxCounts", "SessionDescription", "describe_session", "mailbox_counts"),
    ".descriptor": (
        "DESCRIPTOR_VERSION", "ContinuableDescriptor", "Descriptor", "OneShotDescriptor", "ToolFilter",
        "fold_resume_descriptor", "parse_descriptor",
    ),
    ".durability": ("Durability", "durability_policy"),
    ".errors": (
        "CorruptSessionError", "DescriptorError", "DurabilityError", "FencedError", "InvalidHeaderError",
        "InvalidSessionIdError", "LeaseHeldError", "LockTimeoutError", "InvalidRecordError", "RecordTooLargeError", "OutOfMemoryError",
        "ReadOnlyStoreError", "UnreadableStoreError", "SessionExistsError", "SessionNotFoundError",
        "AmbiguousIdError", "InvalidQueryError", "StoreFormatError", "StoreNotFoundError", "SubagentError",
        "UnavailableSessionError", "UnsupportedFormatError",
    ),
    ".events": ("EVENT_TYPES", "closers"),
    ".framing": ("MAX_RECORD_BYTES", "Damage", "ScanResult", "encode_record", "scan"),
    ".header": ("SessionHeader", "parse_header"),
    ".held": ("HeldSession", "held_sessions"),
    ".ids": ("IdGenerator", "is_valid_session_id", "new_id", "validate_session_id"),
    ".index": ("IndexEntry", "IndexRead", "ReindexReport", "add_child", "read_children", "read_index", "reindex"),
    ".lease": (
        "Lease", "OwnerCache", "OwnerRecord", "acquire_lease", "check_lease", "heartbeat", "maintenance_owner",
        "owner_alive", "owner_gone", "read_lease", "read_owner", "register_owner", "release_lease", "remove_owner",
        "session_status", "set_lease_state",
    ),
    ".log": ("LogWriter", "SeqMismatchError", "load_projection", "read_projection"),
    ".mailbox": ("accept",),
    ".mailbox_read": ("MailboxMessage", "pending", "read_mailbox"),
    ".outcome": ("OUTCOMES", "OutcomeVerdict", "outcome_of"),
    ".prefix": ("MIN_PREFIX", "resolve_id", "short_ids"),
    ".projection": ("Projection", "Timing"),
    ".reaper": ("OwnerReaper", "reap_owners"),
    ".reader": ("Inspection", "inspect", "read_from", "read_header"),
    ".root": ("STORE_FORMAT", "STORE_VERSION", "Store"),
    ".query": ("Page", "Query"),
    ".retention": ("CollectedRoot", "GcReport", "SkippedRoot", "collect", "parse_age"),
    ".roots": ("DEFAULT_ROOT_LIMIT", "RootEntry", "find_roots", "list_roots", "rebuild_roots", "subagent_count"),
    ".session": ("create_session", "delete_session"),
    ".summary": ("Summary", "SupervisorCount", "summarize"),
    ".tail": ("LogTail",),
}

__all__ = [
    "CheckCounts", "CheckReport", "Violation", "check_store",
    "ChildEntry", "DescendantRow", "DiagnosticEntry", "Identity", "list_children", "list_descendants", "read_identity",
    "ControlRecord", "control_size", "read_controls", "request",
    "DESCRIPTOR_VERSION", "ContinuableDescriptor", "Descriptor", "OneShotDescriptor", "ToolFilter",
    "fold_resume_descriptor", "parse_descriptor",
    "Durability", "durability_policy",
    "CorruptSessionError", "DescriptorError", "DurabilityError", "FencedError", "InvalidHeaderError",
    "InvalidSessionIdError", "LeaseHeldError", "LockTimeoutError", "RecordTooLargeError", "OutOfMemoryError", "InvalidRecordError", "SessionExistsError", "SessionNotFoundError", "AmbiguousIdError",
    "StoreFormatError", "StoreNotFoundError", "ReadOnlyStoreError", "UnreadableStoreError", "SubagentError", "UnavailableSessionError", "UnsupportedFormatError",
    "EVENT_TYPES", "closers",
    "MAX_RECORD_BYTES", "Damage", "ScanResult", "encode_record", "scan",
    "SessionHeader", "parse_header",
    "IdGenerator", "is_valid_session_id", "new_id", "validate_session_id",
    "IndexEntry", "IndexRead", "ReindexReport", "add_child", "read_children", "read_index", "reindex",
    "Lease", "OwnerCache", "OwnerRecord", "acquire_lease", "check_lease", "heartbeat", "maintenance_owner", "owner_alive", "owner_gone", "read_lease", "read_owner",
    "OwnerReaper", "reap_owners", "register_owner", "release_lease", "remove_owner", "session_status", "set_lease_state",
    "LogWriter", "SeqMismatchError", "load_projection", "read_projection",
    "MailboxMessage", "accept", "pending", "read_mailbox",
    "OUTCOMES", "OutcomeVerdict", "outcome_of",
    "MIN_PREFIX", "resolve_id", "short_ids",
    "Projection", "Timing",
    "Inspection", "inspect", "read_from", "read_header",
    "STORE_FORMAT", "STORE_VERSION", "Store",
    "create_session", "delete_session",
    "MailboxCounts", "SessionDescription", "describe_session", "mailbox_counts",
    "HeldSession", "held_sessions",
    "RootEntry", "list_roots", "subagent_count", "DEFAULT_ROOT_LIMIT", "find_roots", "rebuild_roots",
    "Page", "Query", "InvalidQueryError",
    "Summary", "SupervisorCount", "summarize",
    "CollectedRoot", "GcReport", "SkippedRoot", "collect", "parse_age",
    "LogTail",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
