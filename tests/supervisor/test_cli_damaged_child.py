"""A settled child damaged in place, through the real CLI: ``ls`` and ``show`` give its diagnostic.

Audit: such a child listed as ``complete`` with its outcome (its ``settled``
row was taken after an ``lstat`` of type and length), and ``show`` of a child
whose committed log record was overwritten printed the normal view — a
``crashed`` outcome, an open turn — from the records before the damage, and
exited 0. Now ``ls`` lists it ``corrupt`` and ``show`` prints
``error: CORRUPT_SESSION: ...`` with where and why, and exits 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from subagents import store
from subagents.store.framing import FRAME

from ..session_bytes import HEADER_AT, log_start, patch
from .test_cli import cli

TURN = [("turn/start", {}), ("assistant/message", {"text": "done"}), ("turn/end", {"stop_reason": "completed"})]


def settled_children(path: Path) -> store.Store:
    """Root ``r`` with children ``a`` and ``b``, each run at epoch 1 and released (its ``settled`` row written)."""
    st = store.Store(path)
    store.create_session(st, "r")
    owner = store.new_id()
    store.register_owner(st, owner, ttl=60.0)
    for child in ("a", "b"):
        store.create_session(st, child, parent_session="r", origin="subagent", delegation_depth=1, lease_owner=owner,
                             events=[("subagent/descriptor", {"version": 1, "mode": "one-shot", "provider": "p"})])
        with store.LogWriter.open(st, child, epoch=1) as writer:
            writer.append(TURN, commit=True)
        store.release_lease(st, child, owner, 1)
    return st


def flip(st: store.Store, session_id: str, offset: int) -> None:
    with open(st.session_path(session_id), "rb") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
    patch(st, session_id, offset, bytes([byte ^ 0xFF]))


@pytest.mark.parametrize("where", ["header", "log record"])
def test_show_and_ls_of_a_child_damaged_in_place_give_its_diagnostic(tmp_path: Path, where: str) -> None:
    st = settled_children(tmp_path / "st")
    found = store.inspect(st, "b")
    assistant = next(i for i, e in enumerate(found.events) if e["type"] == "assistant/message")
    offset = HEADER_AT + 11 if where == "header" else log_start(st, "b") + found.offsets[assistant] + FRAME.size + 4
    flip(st, "b", offset)

    listed = cli("--store", "st", "ls", "r", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert (rows["b"]["kind"], rows["b"]["reason"]) == ("diagnostic", "corrupt"), rows
    assert (rows["a"]["kind"], rows["a"]["status"], rows["a"]["outcome"]) == ("child", "complete", "completed"), rows

    for extra in ((), ("--json",)):
        shown = cli("--store", "st", "show", "b", *extra, cwd=tmp_path)
        assert shown.returncode == 2 and shown.stdout == "", (shown.stdout, shown.stderr)
        reason = "header crc mismatch" if where == "header" else f"crc-mismatch at byte {found.offsets[assistant]}"
        assert shown.stderr.startswith('error: CORRUPT_SESSION: stored session "b" failed validation: '), shown.stderr
        assert reason in shown.stderr, shown.stderr
    sibling = cli("--store", "st", "show", "a", "--json", cwd=tmp_path)
    assert sibling.returncode == 0 and json.loads(sibling.stdout)["outcome"] == "completed", sibling.stderr
