"""The public ``inspect`` never calls a healthy session corrupt because an append was in flight.

``inspect`` reads without the session lock. A ``pwrite`` copies into the page cache while a reader
copies out of it, and neither waits for the other: a reader that falls behind the writer and is
overtaken sees the batch's later bytes and not yet its earlier ones, zeros between the last record
and a ``turn/end`` that chains. That reads as committed work after damage, ``corrupt``. A listing,
``show``, ``check`` and ``fsck`` read such a log again under the lock, where no append is in flight;
a user's own ``subagents.store.inspect`` (and ``read_from``) did not, unlike the mailbox readers,
which confirm unless their caller says it holds the lock.

The in-flight state is made with the real lock protocol: the test holds the session lock, as an
appender does for its write, while the file shows the batch's later bytes over zeros; it finishes
the write and lets go after the reader started.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from subagents import store
from subagents.store.session_file import SessionLock

from ..session_bytes import log_start
from ._support import CONTINUABLE, make_child
from .test_settled_mtime import TURN


def _half_written(st: store.Store) -> tuple[int, bytes]:
    """A child with two committed turns; returns where the second turn's batch is and its bytes."""
    store.create_session(st, "r")
    make_child(st, "r", "c", descriptor=CONTINUABLE)
    with store.LogWriter.open(st, "c", epoch=0) as writer:
        writer.append(TURN, commit=True)
        writer.append(TURN, commit=True)
    found = store.inspect(st, "c")
    start = log_start(st, "c")
    first_of_second = found.offsets[len(TURN)]
    begin, end = start + first_of_second, start + found.end
    with open(st.session_path("c"), "rb") as handle:
        handle.seek(begin)
        return begin, handle.read(end - begin)


def _read_during_write(st: store.Store, read: Callable[[], Any]) -> Any:
    """``read()`` in a thread, started while the second turn's batch is half copied under the lock."""
    begin, batch = _half_written(st)
    path = st.session_path("c")
    holder = SessionLock("c", path)
    holder.acquire()
    got: dict[str, Any] = {}
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, b"\0" * 16, begin)  # the batch's first bytes not copied yet; its turn/end is
            thread = threading.Thread(target=lambda: got.update(value=_catch(read)), daemon=True)
            thread.start()
            time.sleep(0.3)  # a reader that does not wait for the lock has read by now
            os.pwrite(fd, batch[:16], begin)  # the copy ends
        finally:
            os.close(fd)
    finally:
        holder.release()
        holder.close()
    thread.join(10)
    assert not thread.is_alive()
    value = got["value"]
    if isinstance(value, BaseException):
        raise value
    return value


def _catch(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except BaseException as exc:  # noqa: BLE001 - handed to the test
        return exc


def test_inspect_reads_an_append_in_flight_as_the_append_it_is(st):
    found = _read_during_write(st, lambda: store.inspect(st, "c"))
    assert found.status != "corrupt", found.damage
    assert [e["type"] for e in found.events[-len(TURN):]] == [t for t, _ in TURN]
    assert found.events == store.inspect(st, "c").events


def test_read_from_reads_an_append_in_flight_as_the_append_it_is(st):
    events = _read_during_write(st, lambda: store.read_from(st, "c", 0))
    assert events == store.inspect(st, "c").events
