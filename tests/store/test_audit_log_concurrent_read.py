"""Audit: a reader of a session log that does not hold the session lock sees appends in flight.

The mailbox's readers had this defect (2c0bf43): ``pread_all`` reads a file with one ``pread`` of the
size ``fstat`` gave, then more until a read returns nothing. An append that starts in the zero padding
before that size and extends the file past it lands between the two reads: the first read saw zeros where
the batch begins, the second sees the batch's rest, ``turn/end`` included. ``classify`` then finds damage
(an all-zero frame header, ``undecodable``) with a committed ``turn/end`` chaining after it: ``corrupt``.
The mailbox's readers now confirm such damage under the session lock; the log's readers do not. So a
healthy, running child is read as corrupt by ``inspect`` (``subagents show`` now prints CORRUPT_SESSION
and exits 2 for it, 65ef1e7), by a listing (``DiagnosticEntry corrupt``) and by ``check_store``
(``log-corrupt``), while its writer appends turns normally.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import pytest

from subagents import store
from subagents.store.check import check_store
from subagents.store.lease import write_released

from ._support import CONTINUABLE, make_child

TURNS = 300
CHILDREN = 300
BODY = "x" * 4200  # each turn's batch is longer than a block: every append extends the file past its padding


def _corrupt_by_inspect(st: store.Store) -> str | None:
    found = store.inspect(st, "c", confirm=True)  # a reader without the lock, as show and check read
    return f"inspect: {found.status} {found.damage}" if found.status == "corrupt" else None


def _corrupt_by_listing(st: store.Store) -> str | None:
    rows = store.list_children(st, "r")
    bad = [row for row in rows if isinstance(row, store.DiagnosticEntry)]
    return f"list_children: {bad}" if bad else None


def _corrupt_by_check(st: store.Store) -> str | None:
    report = check_store(st)
    bad = [v for v in report.violations if v.kind == "log-corrupt"]
    return f"check_store: {bad}" if bad else None


@pytest.mark.parametrize("read", [_corrupt_by_inspect, _corrupt_by_check], ids=["inspect", "check_store"])
def test_log_readers_never_take_an_append_in_flight_for_damage(tmp_path, read: Callable[[store.Store], str | None]):
    writer_store = store.Store(tmp_path / "store", durability="none")
    reader_store = store.Store(tmp_path / "store", durability="none")
    owner = store.new_id()
    store.register_owner(writer_store, owner, ttl=600.0)
    store.create_session(writer_store, "r")
    make_child(writer_store, "r", "c", descriptor=CONTINUABLE, lease_owner=owner)
    errors: list[str] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            with store.LogWriter.open(writer_store, "c", epoch=1) as writer:
                for i in range(TURNS):
                    writer.append([("turn/start", {}), ("assistant/message", {"text": f"{i}:{BODY}"}),
                                   ("turn/end", {"stop_reason": "completed"})], commit=True)
                    if errors:
                        return
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)
        finally:
            done.set()

    def reader() -> None:
        while not done.is_set() and not errors:
            try:
                found = read(reader_store)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)
                return
            if found is not None:
                errors.append(found)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=reader) for _ in range(2)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[0]
    assert store.inspect(reader_store, "c").status == "clean"  # the log itself is healthy
    assert not errors, errors[0]
    assert time.monotonic() - started < 120


def test_a_listing_never_takes_a_live_childs_append_in_flight_for_damage(tmp_path):
    """A listing reads a log through ``pread_all`` only while it is shorter than the identity cache's threshold
    (64 KiB; then it reads the suffix after the cache with one ``pread`` of a known length): so each child here
    runs 10 turns, is released (listed from its row from then on) and the next one starts."""
    writer_store = store.Store(tmp_path / "store", durability="none")
    reader_store = store.Store(tmp_path / "store", durability="none")
    owner = store.new_id()
    store.register_owner(writer_store, owner, ttl=600.0)
    store.create_session(writer_store, "r")
    errors: list[str] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for n in range(CHILDREN):
                child = f"c{n}"
                make_child(writer_store, "r", child, descriptor=CONTINUABLE, lease_owner=owner)
                with store.LogWriter.open(writer_store, child, epoch=1) as writer:
                    for i in range(10):
                        writer.append([("turn/start", {}), ("assistant/message", {"text": f"{i}:{BODY}"}),
                                       ("turn/end", {"stop_reason": "completed"})], commit=True)
                    writer.release_lease(owner, write_released)
                if errors:
                    return
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)
        finally:
            done.set()

    def reader() -> None:
        while not done.is_set() and not errors:
            try:
                found = _corrupt_by_listing(reader_store)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)
                return
            if found is not None:
                errors.append(found)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[0]
    assert not [row for row in store.list_children(reader_store, "r") if isinstance(row, store.DiagnosticEntry)]
    assert not errors, errors[0]
