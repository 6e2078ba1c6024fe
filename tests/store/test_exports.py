"""The public surface of ``store``: pinned, each name exported once and importable."""

from __future__ import annotations

import importlib
import pkgutil

from subagents import store

EXPECTED = {
    # check
    "CheckCounts", "CheckReport", "Violation", "check_store",
    # catalog
    "ChildEntry", "DescendantRow", "DiagnosticEntry", "Identity", "list_children", "list_descendants", "read_identity",
    # control
    "ControlRecord", "control_size", "read_controls", "request",
    # descriptor
    "DESCRIPTOR_VERSION", "ContinuableDescriptor", "Descriptor", "OneShotDescriptor", "ToolFilter",
    "fold_resume_descriptor", "parse_descriptor",
    # durability
    "Durability", "durability_policy",
    # errors
    "CorruptSessionError", "DescriptorError", "DurabilityError", "FencedError", "InvalidHeaderError",
    "InvalidSessionIdError", "LeaseHeldError", "LockTimeoutError", "RecordTooLargeError", "OutOfMemoryError", "InvalidRecordError", "SessionExistsError",
    "SessionNotFoundError", "AmbiguousIdError", "StoreFormatError", "StoreNotFoundError", "ReadOnlyStoreError", "UnreadableStoreError", "SubagentError",
    "UnavailableSessionError", "UnsupportedFormatError",
    # events, framing, header, ids
    "EVENT_TYPES", "closers",
    "MAX_RECORD_BYTES", "Damage", "ScanResult", "encode_record", "scan",
    "SessionHeader", "parse_header",
    "IdGenerator", "is_valid_session_id", "new_id", "validate_session_id",
    # index, lease
    "IndexEntry", "IndexRead", "ReindexReport", "add_child", "read_children", "read_index", "reindex",
    "Lease", "OwnerCache", "OwnerRecord", "acquire_lease", "check_lease", "heartbeat", "owner_alive", "owner_gone", "read_lease", "read_owner",
    "OwnerReaper", "reap_owners", "register_owner", "maintenance_owner", "release_lease", "remove_owner", "session_status", "set_lease_state",
    # log, mailbox, projection, reader, root, session
    "LogWriter", "SeqMismatchError", "load_projection", "read_projection",
    "MailboxMessage", "accept", "pending", "read_mailbox",
    # outcome
    "OUTCOMES", "OutcomeVerdict", "outcome_of",
    "MIN_PREFIX", "resolve_id", "short_ids",
    "Projection", "Timing",
    "Inspection", "inspect", "read_from", "read_header",
    "STORE_FORMAT", "STORE_VERSION", "Store",
    "create_session", "delete_session",
    # the CLI's read-only views: description, held, roots, tail
    "MailboxCounts", "SessionDescription", "describe_session", "mailbox_counts",
    "HeldSession", "held_sessions",
    "RootEntry", "list_roots", "subagent_count", "DEFAULT_ROOT_LIMIT", "find_roots", "rebuild_roots",
    "Page", "Query", "InvalidQueryError",
    "Summary", "SupervisorCount", "summarize",
    # retention (gc)
    "CollectedRoot", "GcReport", "SkippedRoot", "collect", "parse_age",
    "LogTail",
}


def test_all_is_pinned():
    """store.__all__ is exactly the reviewed list; a new public name needs this test changed."""
    assert set(store.__all__) == EXPECTED


def test_each_name_exported_once_and_present():
    """No duplicates in __all__, and every name resolves on the package."""
    assert len(store.__all__) == len(set(store.__all__))
    for name in store.__all__:
        assert getattr(store, name, None) is not None, name


def test_public_names_come_from_store_modules():
    """Every exported class or function is defined inside the store package (nothing leaks from deps)."""
    for name in store.__all__:
        value = getattr(store, name)
        module = getattr(value, "__module__", None)
        if module is not None and callable(value) and not isinstance(value, type(store.Descriptor)):
            assert module.startswith("subagents.store."), (name, module)


def test_every_module_declares_all_and_imports_alone():
    """Each store module has an __all__ whose names exist, and imports without the others pre-loaded."""
    for info in pkgutil.iter_modules(store.__path__):
        module = importlib.import_module(f"store.{info.name}")
        assert isinstance(module.__all__, list), info.name
        for name in module.__all__:
            assert hasattr(module, name), (info.name, name)


def test_store_imports_neither_worker_nor_supervisor():
    """The lowest layer never imports the packages built on it."""
    import ast
    from pathlib import Path

    for path in Path(store.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in ("worker", "supervisor"), (path.name, name)
