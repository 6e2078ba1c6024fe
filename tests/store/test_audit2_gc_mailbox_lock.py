"""Audit: ``gc`` waits for its own lock when a mailbox reads damaged under it.

``collect`` locks every session of a subtree (``PinnedLock``, an ``flock`` on the session's file) and
examines each again under it (``_Pass.examine`` -> ``description.mailbox_counts`` -> ``read_mailbox``).
``read_mailbox`` is called without ``locked=True``, so a mailbox whose damage is no torn tail is read a
second time under the session lock, taken on a new descriptor (``scan_mailbox``): ``flock`` makes it wait
for gc's own descriptor. Before 54e0773 that was a gc hung for good; since, the wait ends after
``LOCK_TIMEOUT_S`` (30 s) with ``LockTimeoutError``, which nothing in ``examine`` catches: gc aborts the
whole pass with LOCK_TIMEOUT instead of skipping the subtree as ``unreadable`` (what the unlocked plan
pass does for the same mailbox). It needs the damage to appear between the plan pass and the locked one:
forced here by writing a damaged mailbox when the locked pass examines the root (a ``sys.setprofile``
hook, the bytes a real ``accept`` wrote elsewhere with one byte inverted). ``LOCK_TIMEOUT_S`` is set to
0.2 s so the test is fast; the store is not replaced.
"""

from __future__ import annotations

import sys
import threading
from typing import Any


from subagents import store
from subagents.store import Store, collect, description, locks

from ._support import read_file
from .test_retention import DAY, subtree


def test_gc_skips_a_subtree_whose_mailbox_reads_damaged_under_its_lock(st: Store, monkeypatch) -> None:
    monkeypatch.setattr(locks, "LOCK_TIMEOUT_S", 0.2)
    subtree(st, "rGc", children=1)
    store.create_session(st, "scratch")
    ids = store.IdGenerator()
    for text in ("one", "two"):
        store.accept(st, "scratch", source={"kind": "user"}, content=text, ids=ids)
    damaged = bytearray(read_file(st.path("scratch", "mailbox")))
    damaged[12] ^= 0xFF  # inside the first message: the second follows it

    calls: list[str] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is description.mailbox_counts.__code__ and frame.f_locals["session_id"] == "rGc":
            calls.append("rGc")
            if len(calls) == 2:  # the locked pass: gc holds rGc's lock now
                with open(st.path("rGc", "mailbox"), "wb") as handle:
                    handle.write(bytes(damaged))

    got: dict[str, Any] = {}

    def run() -> None:
        sys.setprofile(hook)
        try:
            got["report"] = collect(st, 7 * DAY)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got["error"] = exc
        finally:
            sys.setprofile(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "gc waited for its own lock without bound"
    assert len(calls) >= 2
    assert "error" not in got, repr(got.get("error"))
    report = got["report"]
    assert [(s.id, s.reason) for s in report.skipped] == [("rGc", "unreadable")], report
    assert st.exists("rGc")
