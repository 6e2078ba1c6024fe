"""A reader that does not hold the session lock sees acceptances in flight: never damage.

An acceptance writes its record into the mailbox's padding with one ``pwrite``; a reader that reads at the same
moment may see part of it (a frame whose bytes are not all there yet). That is an append not yet acknowledged,
not a changed committed record: readers must report the messages before it, and the message itself once its
acceptance returned, never ``CORRUPT_SESSION``.
"""

from __future__ import annotations

import threading
import time

import pytest

from subagents import store
from subagents.store.errors import CorruptSessionError

from ._support import ONE_SHOT

ACCEPTANCES = 200
BODY = "x" * 9000  # spans pages: a reader may see the first of them written and the rest not yet


@pytest.mark.parametrize("shared_handle", [True, False], ids=["one-handle", "two-handles"])
def test_readers_never_take_an_acceptance_in_flight_for_damage(tmp_path, shared_handle):
    writer_store = store.Store(tmp_path / "store", durability="none")
    store.create_session(writer_store, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    reader_store = writer_store if shared_handle else store.Store(tmp_path / "store", durability="none")
    ids = store.IdGenerator()
    acknowledged: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for i in range(ACCEPTANCES):
                store.accept(writer_store, "s1", source={"kind": "coordinator", "sender": "p"}, content=f"{i}:{BODY}", ids=ids)
                acknowledged.append(i)
        finally:
            done.set()

    def read() -> None:
        while not done.is_set():
            floor = len(acknowledged)  # acknowledged before this read began: it must see them
            try:
                seen = len(store.read_mailbox(reader_store, "s1"))
                waiting = len(store.pending(reader_store, "s1", consumed=0, last_consumed_id=None))
            except CorruptSessionError as exc:
                errors.append(exc)
                return
            if seen < floor or waiting < floor:
                errors.append(AssertionError(f"read {seen} / {waiting} messages after {floor} were acknowledged"))
                return

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(2)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[0]
    assert len(store.read_mailbox(reader_store, "s1")) == ACCEPTANCES
    assert time.monotonic() - started < 120
