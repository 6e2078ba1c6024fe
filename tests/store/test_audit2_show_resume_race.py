"""Audit (084acb6): ``show`` of a child resumed while it reads calls a healthy log corrupt.

``describe_session`` reads the child's log first (``inspect``) and its parent's index afterwards
(``lost_committed``), and calls the log ``corrupt`` when it read ``torn`` and ends before the ``end``
of the settled row it finds then. The row may be newer than the log it read: a child with a torn tail
(its host died mid-append) is resumed by a supervisor — the torn tail cut, its open turn closed, the
lease released with a ``settled`` row whose ``end`` is past the bytes ``show`` read — between the two
reads. Nothing is damaged at any time, yet ``show`` prints CORRUPT_SESSION and exits 2. The listing
reads in the other order (row, then file: ``_entry_or_damage``), and a log only grows after a row.

The interleaving is forced: the reader is held, as a preemption would hold it, when it calls
``read_index`` (a ``sys.setprofile`` hook in its own thread), while a real ``LogWriter`` resumes and
releases the child. Nothing of the store is replaced.
"""

from __future__ import annotations

import sys
from typing import Any


from subagents import store
from subagents.store import index
from subagents.store.framing import encode_record
from subagents.store.lease import write_released

from ..session_bytes import log_start, patch
from ._support import CONTINUABLE, make_child
from .test_settled_mtime import owner  # noqa: F401 - fixture


def test_show_of_a_child_resumed_between_its_log_and_its_row_is_not_corrupt(st, owner):  # noqa: F811
    store.create_session(st, "r")
    make_child(st, "r", "c", descriptor=CONTINUABLE, lease_owner=owner)
    with store.LogWriter.open(st, "c", epoch=1) as writer:
        writer.append([("turn/start", {}), ("assistant/message", {"text": "working"})], commit=True)
    found = store.inspect(st, "c")
    torn = encode_record({"seq": len(found.events), "ts": 1.0, "type": "assistant/message",
                          "data": {"text": "y" * 200}, "epoch": 1})
    patch(st, "c", log_start(st, "c") + found.end, torn[: len(torn) // 2])  # its host died mid-append
    assert store.inspect(st, "c").status == "torn"

    def resume_and_release() -> None:
        store.acquire_lease(st, "c", owner)
        with store.LogWriter.open(st, "c", epoch=2) as resumed:  # cuts the torn tail, closes the open turn
            resumed.append([("turn/start", {}), ("assistant/message", {"text": "done"}),
                            ("turn/end", {"stop_reason": "completed"})], commit=True)
            resumed.release_lease(owner, write_released)

    fired: list[bool] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if not fired and event == "call" and frame.f_code is index.read_index.__code__:
            fired.append(True)
            resume_and_release()

    sys.setprofile(hook)
    try:
        described = store.describe_session(st, "c")
    finally:
        sys.setprofile(None)
    assert fired
    assert store.inspect(st, "c").status == "clean"  # nothing was ever damaged
    [row] = [e for e in store.read_children(st, "r") if e.id == "c"]
    assert row.settled is not None
    assert described.inspection.status != "corrupt", described.inspection.damage
