"""Errors: stable codes, the right built-in bases, and a lossless trip across the worker pipe."""

from __future__ import annotations

import pickle

import pytest

from subagents import store
from subagents.store.errors import error_registry, from_wire

SAMPLES = [
    store.InvalidSessionIdError("../x"),
    store.InvalidHeaderError("bad header"),
    store.StoreFormatError("not a store", path="/x"),
    store.StoreNotFoundError("there is no store at /x", path="/x"),
    store.ReadOnlyStoreError("the store at /x is read-only", path="/x"),
    store.SessionNotFoundError("s1"),
    store.SessionExistsError("s1"),
    store.CorruptSessionError("s1", "crc-mismatch at byte 9", offset=9),
    store.UnsupportedFormatError("newer", event_type="future/x"),
    store.FencedError("s1", epoch=1, current_epoch=2),
    store.DurabilityError("fsync failed", what="log of s1"),
    store.LeaseHeldError("s1", owner="o1", epoch=3),
    store.DescriptorError("persisted subagent descriptor payload must be an object"),
    store.SeqMismatchError("append seq mismatch", session_id="s1"),
    store.UnreadableStoreError("/st", PermissionError(13, "Permission denied")),
]


def test_codes_are_stable_and_distinct():
    """Each class names its failure with a fixed code."""
    codes = {type(e).__name__: e.code for e in SAMPLES}
    assert codes == {
        "InvalidSessionIdError": "INVALID_SESSION_ID", "InvalidHeaderError": "INVALID_HEADER", "StoreFormatError": "STORE_FORMAT",
        "StoreNotFoundError": "STORE_NOT_FOUND", "ReadOnlyStoreError": "STORE_READ_ONLY",
        "SessionNotFoundError": "SESSION_NOT_FOUND", "SessionExistsError": "SESSION_EXISTS", "CorruptSessionError": "CORRUPT_SESSION",
        "UnsupportedFormatError": "UNSUPPORTED_FORMAT", "FencedError": "FENCED", "DurabilityError": "DURABILITY_FAILED",
        "LeaseHeldError": "LEASE_HELD", "DescriptorError": "INVALID_DESCRIPTOR", "SeqMismatchError": "SEQ_MISMATCH",
        "UnreadableStoreError": "STORE_UNREADABLE",
    }
    assert all(isinstance(e, store.SubagentError) for e in SAMPLES)


@pytest.mark.parametrize("cls, base", [(store.InvalidSessionIdError, ValueError), (store.InvalidHeaderError, ValueError),
                                       (store.SessionNotFoundError, LookupError), (store.DurabilityError, OSError),
                                       (store.StoreNotFoundError, FileNotFoundError),
                                       (store.UnreadableStoreError, PermissionError), (store.StoreNotFoundError, store.StoreFormatError),
                                       (store.ReadOnlyStoreError, PermissionError),
                                       (store.DescriptorError, ValueError), (store.SeqMismatchError, ValueError)])
def test_builtin_bases(cls, base):
    """Bad input is a ValueError, a missing session a LookupError, a failed fsync an OSError."""
    assert issubclass(cls, base)


@pytest.mark.parametrize("error", SAMPLES, ids=lambda e: type(e).__name__)
def test_wire_and_pickle_roundtrip(error):
    """to_wire/from_wire and pickle rebuild the same class with the same code, message and fields."""
    for back in (from_wire(error.to_wire()), pickle.loads(pickle.dumps(error))):
        assert type(back) is type(error)
        assert (back.code, str(back), back.fields) == (error.code, str(error), error.fields)
        for key, value in error.fields.items():
            assert getattr(back, key) == value


def test_a_long_invalid_id_is_echoed_short():
    """A malformed id of any length is echoed as a short prefix and its length (issue #13)."""
    error = store.InvalidSessionIdError("x" * 5000)
    assert len(str(error)) < 120 and "(5000 characters)" in str(error)
    assert str(store.InvalidSessionIdError("../x")) == "invalid session id '../x'"


def test_unknown_wire_class_becomes_the_root():
    """An error class this process does not know is rebuilt as SubagentError, code kept."""
    back = from_wire({"class": "Nope", "module": "elsewhere", "code": "X_CODE", "message": "m", "fields": {"a": 1}})
    assert type(back) is store.SubagentError and back.code == "X_CODE" and back.a == 1
    assert "subagents.store.errors.FencedError" in error_registry()
