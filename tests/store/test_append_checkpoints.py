"""Append checkpoints: a hint per shared framed file, bounded so a long-lived store handle does not grow with
every mailbox and index it ever appended to."""

from __future__ import annotations

import os

from subagents import store
from subagents.store.appender import append_record
from subagents.store.checkpoints import CHECKPOINT_LIMIT, AppendCheckpoints
from subagents.store.framing import scan

from ._support import ONE_SHOT


def test_a_store_handle_keeps_at_most_its_limit_of_checkpoints(tmp_path):
    """One acceptance into each of more mailboxes than the limit leaves the limit, the latest kept."""
    st = store.Store(tmp_path / "store", durability="none")
    ids = store.IdGenerator()
    count = CHECKPOINT_LIMIT + 20
    for i in range(count):
        store.create_session(st, f"s{i}", events=[("subagent/descriptor", ONE_SHOT)])
        store.accept(st, f"s{i}", source={"kind": "coordinator", "sender": "p"}, content=i, ids=ids)
    assert len(st.index_tails) == CHECKPOINT_LIMIT
    assert st.index_tails.get(f"mailbox/s{count - 1}") is not None
    assert st.index_tails.get("mailbox/s0") is None


def test_an_append_after_its_checkpoint_was_dropped_continues_the_file(tmp_path):
    """A dropped checkpoint is only a lost hint: the next append reads the file and takes the next seq."""
    tails = AppendCheckpoints(limit=2)
    paths = [tmp_path / f"f{i}" for i in range(3)]
    fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600) for p in paths]
    try:
        for _ in range(2):
            for i, fd in enumerate(fds):
                append_record(fd, {"n": i}, tails=tails, key=f"f{i}", owner=f"f{i}", limit=1 << 20)
        assert len(tails) == 2 and tails.get("f0") is None  # f0's was the least recently used
        assert append_record(fds[0], {"n": 0}, tails=tails, key="f0", owner="f0", limit=1 << 20) == 2
    finally:
        for fd in fds:
            os.close(fd)
    result = scan(paths[0].read_bytes())
    assert result.damage is None and [r["seq"] for r in result.records] == [0, 1, 2]


def test_using_a_checkpoint_keeps_it():
    """The least recently used is dropped, not the oldest written: a hot file keeps its hint."""
    tails = AppendCheckpoints(limit=2)
    tails["a"] = (1, 1)
    tails["b"] = (2, 2)
    assert tails.get("a") == (1, 1)
    tails["c"] = (3, 3)
    assert tails.get("a") == (1, 1) and tails.get("b") is None
    assert tails.pop("a", None) == (1, 1) and len(tails) == 1
