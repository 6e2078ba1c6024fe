"""Catalog rows in the children index (issue 12 item 5): a settled child is listed from the index alone.

The creation record carries the row's static fields, a release appends the
``settled`` row and a re-acquisition an ``active`` one, both under the session
lock (``store/rows.py``). Old records without them, and damaged new ones,
send the listing back to the child's own files; ``check`` finds a row that lies.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

import pytest

from subagents import store
import subagents.store.catalog as catalog
from subagents.store.check import check_store
from subagents.store.framing import encode_record, scan
from subagents.store.index import mark_settled
from subagents.store.session import NewSession, commit_sessions, create_sessions, publish_sessions

from ..session_bytes import newest_slot, slot_bytes, write_header, write_slot
from ._support import CONTINUABLE, ONE_SHOT, make_child, read_file, write_file

OLD = time.time() - 600
TURN = [("turn/start", {}), ("assistant/message", {"text": "done"}), ("turn/end", {"stop_reason": "completed"})]
FAILED = [("turn/start", {}), ("turn/end", {"stop_reason": "error", "diagnostic": "BOOM: it broke\nsecond line"})]


@pytest.fixture
def owner(st) -> str:
    owner = store.new_id()
    store.register_owner(st, owner, ttl=60.0)
    return owner


def settled_child(st: store.Store, parent: str, child: str, owner: str, *, descriptor: dict[str, Any] = ONE_SHOT,
                  turn: list = TURN, created_at: float = OLD, grandchild: str | None = None) -> None:
    """A child as a supervisor leaves it: created leased to ``owner``, one turn at epoch 1 (in which it
    creates ``grandchild``), lease released."""
    make_child(st, parent, child, descriptor=descriptor, created_at=created_at, lease_owner=owner)
    if grandchild is not None:
        make_child(st, child, grandchild, created_at=OLD)
    with store.LogWriter.open(st, child, epoch=1) as writer:
        writer.append(turn, commit=True)
    store.release_lease(st, child, owner, 1)


def index_records(st: store.Store, parent: str) -> list[dict[str, Any]]:
    return scan(read_file(st.children_index_path(parent))).records


def count_child_reads(monkeypatch) -> dict[str, int]:
    """Counts of the per-child reads of the fallback path (header, identity, lease)."""
    calls = {"header": 0, "identity": 0, "lease": 0}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(catalog, "header_of", counting("header", catalog.header_of))
    monkeypatch.setattr(catalog, "read_identity", counting("identity", catalog.read_identity))
    monkeypatch.setattr(catalog, "lease_of", counting("lease", catalog.lease_of))
    return calls


def test_creation_and_release_write_the_row(st, owner):
    """The entry carries mode and label; the release appends the settled row (outcome, error, last activity)."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "c1", owner, descriptor={**ONE_SHOT, "label": "one"})
    settled_child(st, "r", "c2", owner, descriptor={**CONTINUABLE, "label": "two"}, turn=FAILED)
    records = index_records(st, "r")
    assert [(r["id"], r.get("mode"), r.get("label"), r.get("state")) for r in records] == [
        ("c1", "one-shot", "one", None), ("c1", None, None, "settled"), ("c2", "continuable", "two", None), ("c2", None, None, "settled")]
    assert (records[1]["outcome"], "error" in records[1]) == ("completed", False)
    assert (records[3]["outcome"], records[3]["error_code"], records[3]["error"]) == ("error", "BOOM", "BOOM: it broke")
    assert records[3]["last_at"] == store.inspect(st, "c2").events[-1]["ts"]
    entries = store.read_children(st, "r")
    assert [(e.mode, e.label, e.settled.outcome) for e in entries] == [("one-shot", "one", "completed"), ("continuable", "two", "error")]


def test_a_settled_child_is_listed_from_the_index_alone(st, owner, monkeypatch):
    """No header, identity or lease of a settled child is read; the row equals the one its files give."""
    store.create_session(st, "r", created_at=OLD)
    for i in range(5):
        settled_child(st, "r", f"c{i}", owner, turn=FAILED if i == 3 else TURN, grandchild="g" if i == 2 else None)
    from_files = [catalog._row(st, "r", f"c{i}", store.OwnerCache(st), None) for i in range(5)]
    calls = count_child_reads(monkeypatch)
    rows = store.list_children(st, "r")
    assert calls == {"header": 0, "identity": 0, "lease": 0}
    assert rows == from_files
    assert [r.has_children for r in rows] == [False, False, True, False, False]
    assert rows[3].outcome == "error" and rows[3].error_code == "BOOM"


def test_has_children_is_recorded_at_settlement(st, owner):
    """``has_children`` is the child's own index when it settled (a settled child runs no turn, so it makes
    no children); a child created under it behind the store's back is a finding of ``check``."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "c", owner, grandchild="g")
    settled_child(st, "r", "d", owner)
    assert [r.has_children for r in store.list_children(st, "r")] == [True, False]
    assert [e.settled.has_children for e in store.read_children(st, "r")] == [True, False]
    assert check_store(st).clean
    make_child(st, "d", "late", created_at=OLD)  # through the store: it writes the row again
    assert [r.has_children for r in store.list_children(st, "r")] == [True, True]
    assert check_store(st).clean
    # a version that left the row as it was, or an index edited by hand: a finding of ``check``
    mark_settled(st, "r", "d", replace(store.read_children(st, "r")[-1].settled, has_children=False))
    assert [v.session_id for v in check_store(st).of_kind("index-row")] == ["d"]


def test_a_child_indexed_after_its_parent_settled_leaves_the_row_saying_so(st, owner):
    """A delegation in flight while its parent settles (a parent cancelled by its own parent): the child is
    published, the parent's lease released (its row: no children, its index lists none yet), then the child
    is indexed. The creation writes the row again; no reading of the store, before or after, finds a lie."""
    store.create_session(st, "r", created_at=OLD)
    make_child(st, "r", "p", created_at=OLD, lease_owner=owner)
    request = NewSession("g", parent_session="p", origin="subagent", delegation_depth=2,
                         events=[("subagent/descriptor", dict(ONE_SHOT))], created_at=OLD)
    published = publish_sessions(st, [request])
    with store.LogWriter.open(st, "p", epoch=1) as writer:
        writer.append(TURN, commit=True)
    store.release_lease(st, "p", owner, 1)
    assert [e.settled.has_children for e in store.read_children(st, "r")] == [False]
    [created] = commit_sessions(st, [request], published)
    assert not isinstance(created, BaseException), created
    assert [r.has_children for r in store.list_children(st, "r")] == [True]
    assert [e.settled and e.settled.has_children for e in store.read_children(st, "r")] == [True]
    assert check_store(st).clean


def test_a_rolled_back_child_of_a_settled_child_leaves_its_row_saying_it_has_none(st, owner):
    """A start under a settled child that is cancelled once the child is indexed removes it again
    (``delete_session``): the parent's row, which said it had one, says it has none."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "p", owner)
    [created] = create_sessions(st, [NewSession("g", parent_session="p", origin="subagent", delegation_depth=2,
                                                events=[("subagent/descriptor", dict(ONE_SHOT))], created_at=OLD)])
    assert not isinstance(created, BaseException), created
    assert [e.settled.has_children for e in store.read_children(st, "r")] == [True]
    store.delete_session(st, "g", parent_session="p")
    assert [e.settled and e.settled.has_children for e in store.read_children(st, "r")] == [False]
    assert [r.has_children for r in store.list_children(st, "r")] == [False]
    assert check_store(st).clean


def test_a_running_child_still_costs_its_files(st, owner, monkeypatch):
    """A child whose row is not settled (just created, leased) is read from its files: status running."""
    store.create_session(st, "r", created_at=OLD)
    make_child(st, "r", "c", created_at=OLD, lease_owner=owner)
    calls = count_child_reads(monkeypatch)
    opened: list[str] = []
    real_open = catalog.open_session
    monkeypatch.setattr(catalog, "open_session", lambda st_, sid, **kw: (opened.append(sid), real_open(st_, sid, **kw))[1])
    [row] = store.list_children(st, "r")
    assert (row.status, calls["lease"]) == ("running", 1)
    # header, log and lease through one descriptor, and no identity cache looked for (a log this
    # short has none): one open of the child's file, nothing else of the child's
    assert opened == ["c"]


def test_reactivation_invalidates_the_settled_row(st, owner):
    """acquire_lease appends ``active`` before it takes the lease: the listing sees running, then settled again."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "c", owner, descriptor=CONTINUABLE)
    assert store.list_children(st, "r")[0].status == "complete"
    other = store.new_id()
    store.register_owner(st, other, ttl=60.0)
    lease = store.acquire_lease(st, "c", other)
    assert [r.get("state") for r in index_records(st, "r")] == [None, "settled", "active"]
    [row] = store.list_children(st, "r")
    assert (row.status, row.outcome) == ("running", "completed")
    with store.LogWriter.open(st, "c", epoch=lease.epoch) as writer:
        writer.append(FAILED, commit=True)
    store.release_lease(st, "c", other, lease.epoch)
    [row] = store.list_children(st, "r")
    assert (row.status, row.outcome, row.error_code) == ("complete", "error", "BOOM")
    assert store.read_children(st, "r")[0].settled.outcome == "error"
    assert check_store(st).clean


def test_a_root_lease_writes_no_row(st, owner):
    """Only subagent children have rows: a root's release appends nothing anywhere."""
    store.create_session(st, "r", created_at=OLD)
    lease = store.acquire_lease(st, "r", owner)
    store.release_lease(st, "r", owner, lease.epoch)
    # its children index exists from its creation (store.prepare_index), and stays empty
    assert [os.path.getsize(os.path.join(st.children_index_dir, n)) for n in os.listdir(st.children_index_dir)] == [0]


def test_old_records_without_row_fields_list_from_the_files(st, owner, monkeypatch):
    """An index written by an older build (no mode, no state records) lists as before, from each child's files."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "c", owner, descriptor={**ONE_SHOT, "label": "old"})
    write_file(st.children_index_path("r"), encode_record({"id": "c", "created_at": OLD, "origin": "subagent", "seq": 0}))
    calls = count_child_reads(monkeypatch)
    [row] = store.list_children(st, "r")
    assert (row.label, row.status, row.outcome, calls["header"]) == ("old", "complete", "completed", 1)
    # a settled record after an old entry (no mode) is not enough either: the static fields come from the files
    write_file(st.children_index_path("r"), encode_record({"id": "c", "created_at": OLD, "origin": "subagent", "seq": 0})
               + encode_record({"id": "c", "state": "settled", "outcome": "completed", "last_at": OLD, "seq": 1}))
    [row] = store.list_children(st, "r")
    assert (row.label, calls["header"]) == ("old", 2)


@pytest.mark.parametrize("bad", [
    {"outcome": 7},  # a wrong type: the record is damage, skipped
    {"last_at": "yesterday"},
    {"outcome": "vanished"},  # a word this build does not know: the files say
    {"state": "finished"},
])
def test_damaged_state_records_fall_back_to_the_files(st, owner, monkeypatch, bad):
    """A settled record of the wrong shape never hides the child, nor changes its row: the files decide."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "c", owner, turn=FAILED)
    settled_child(st, "r", "d", owner)
    blob = bytearray(read_file(st.children_index_path("r")))
    records = index_records(st, "r")
    rebuilt = b"".join(encode_record({**r, **bad} if (r["id"], r.get("state")) == ("c", "settled") else r) for r in records)
    write_file(st.children_index_path("r"), rebuilt)
    assert blob != rebuilt
    calls = count_child_reads(monkeypatch)
    rows = store.list_children(st, "r")
    assert [(r.id, r.status, r.outcome, r.error_code) for r in rows] == [("c", "complete", "error", "BOOM"), ("d", "complete", "completed", None)]
    assert calls["header"] == 1  # c alone, from its files; d from the index


def test_a_torn_settled_record_falls_back(st, owner):
    """A crash mid-append of the settled row leaves a torn tail: the child lists from its files."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "c", owner)
    data = read_file(st.children_index_path("r"))
    write_file(st.children_index_path("r"), data[:-5])
    [row] = store.list_children(st, "r")
    assert (row.status, row.outcome) == ("complete", "completed")
    assert store.read_children(st, "r")[0].settled is None


def test_state_records_of_unknown_or_removed_children_are_ignored(st, owner):
    """A state record before its entry, or after its tombstone, lists nothing."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "c", owner)
    records = [{"id": "ghost", "state": "settled", "outcome": "completed", "last_at": OLD}] + [
        {k: v for k, v in r.items() if k != "seq"} for r in index_records(st, "r")] + [
        {"id": "c", "removed": True}, {"id": "c", "state": "settled", "outcome": "completed", "last_at": OLD}]
    write_file(st.children_index_path("r"), b"".join(encode_record({**r, "seq": i}) for i, r in enumerate(records)))
    assert store.list_children(st, "r") == []


def test_a_damaged_child_with_a_settled_row_is_listed_as_a_diagnostic(st, owner):
    """A header rewritten after the child settled: the file's time is not the one its row recorded, so
    the listing reads the file and lists the damage (it once listed the row: tests/store/test_settled_mtime.py)."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "c", owner)
    settled_child(st, "r", "d", owner)
    write_header(st, "c", b"\xc1not msgpack")
    rows = store.list_children(st, "r")
    assert [(r.id, r.kind) for r in rows] == [("c", "diagnostic"), ("d", "child")] and rows[0].reason == "corrupt"
    report = check_store(st)
    assert [v.kind for v in report.violations] == ["header-corrupt"]


def test_check_finds_a_row_that_lies(st, owner):
    """A settled row whose log says otherwise, static fields another descriptor contradicts,
    and a settled row beside a live lease are ``index-row`` findings."""
    store.create_session(st, "r", created_at=OLD)
    for child in ("a", "b", "c", "d"):
        settled_child(st, "r", child, owner)
    records = index_records(st, "r")
    edits = {("a", "settled"): {"outcome": "error", "error": "made up"}, ("b", None): {"label": "renamed"}}
    write_file(st.children_index_path("r"), b"".join(
        encode_record({**r, **edits.get((r["id"], r.get("state")), {})}) for r in records))
    # c: its lease taken behind the store's back (no 'active' row), by a live owner
    taken = store.Lease(owner, 2, "running", time.time()).to_record()
    write_slot(st, "c", 1 - newest_slot(st, "c"), slot_bytes({"gen": 99, **taken}))
    report = check_store(st)
    found = {v.session_id: v.evidence for v in report.of_kind("index-row")}
    assert set(found) == {"a", "b", "c"}, str(report)
    assert "label 'renamed'" in found["b"] and "live owner" in found["c"] and "made up" in found["a"]


def test_reindex_keeps_the_static_fields_and_the_next_release_the_settled_row(st, owner, monkeypatch):
    """A rebuilt index has each child's mode and label (from its identity), no state records: the child
    is listed from its files, as it was, until its next release writes its settled row again."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "c", owner, descriptor={**CONTINUABLE, "label": "kept"}, turn=FAILED)
    before = store.list_children(st, "r")
    store.reindex(st)
    [entry] = store.read_children(st, "r")
    assert (entry.mode, entry.label, entry.settled) == ("continuable", "kept", None)
    assert store.list_children(st, "r") == before
    lease = store.acquire_lease(st, "c", owner)
    store.release_lease(st, "c", owner, lease.epoch)
    calls = count_child_reads(monkeypatch)
    assert store.list_children(st, "r") == before and calls["header"] == 0


def test_a_writer_projection_gives_the_same_row_as_the_files(st, owner):
    """``settled_row`` from the projection a log writer holds equals the one read from the child's files
    (a writer that releases the lease itself writes the row without reading them)."""
    from subagents.store.rows import settled_row

    store.create_session(st, "r", created_at=OLD)
    make_child(st, "r", "c", created_at=OLD, lease_owner=owner)
    with store.LogWriter.open(st, "c", epoch=1) as writer:
        writer.append(FAILED, commit=True)
        from_writer = settled_row(st, writer.header, writer.projection)
    assert from_writer == settled_row(st, store.read_header(st, "c")) and from_writer.error_code == "BOOM"


def test_a_settled_row_written_before_rows_said_where_the_log_ended_is_no_violation(st, owner):
    """A store written by an earlier build has settled rows without ``end``: ``check`` reads the missing
    field as unknown, not as a row that contradicts its log, and the listing still uses the row."""
    store.create_session(st, "r")  # the parent (a child without one is a violation of its own: parent-missing)
    settled_child(st, "r", "c1", owner)
    path = st.children_index_path("r")
    old = [{k: v for k, v in record.items() if k != "end"} for record in index_records(st, "r")]
    assert any(record.get("state") == "settled" for record in old)
    write_file(path, b"".join(encode_record(record) for record in old))
    assert check_store(st).clean, check_store(st).violations
    [row] = store.list_children(st, "r")
    assert (row.id, row.outcome) == ("c1", "completed")


def test_a_settled_row_written_before_rows_said_what_a_drain_dropped_is_no_violation(st, owner):
    """A child whose accepted work a drain dropped lists ``2 accepted messages dropped unrun (drain)``;
    an earlier build's settled row has no text there, which ``check`` takes as unknown, not as a
    contradiction of the log."""
    from subagents.store.mailbox import accept

    store.create_session(st, "r")
    make_child(st, "r", "c1", created_at=OLD, lease_owner=owner)
    ids = [accept(st, "c1", source={"kind": "user"}, content=text, ids=store.IdGenerator()) for text in ("one", "two")]
    with store.LogWriter.open(st, "c1", epoch=1) as writer:
        writer.append([*TURN, *(("message/discarded", {"message_id": m, "cause": "drain"}) for m in ids)], commit=True)
    store.release_lease(st, "c1", owner, 1)
    [row] = store.list_children(st, "r")
    assert (row.outcome, row.error) == ("drained", "2 accepted messages dropped unrun (drain)")
    old = [{k: v for k, v in record.items() if k != "error"} for record in index_records(st, "r")]
    write_file(st.children_index_path("r"), b"".join(encode_record(record) for record in old))
    assert check_store(st).clean, check_store(st).violations


def test_every_kind_of_row_lists_as_the_entry_guard_reads_it(st, owner):
    """A listing's rows are those ``catalog._entry`` gives for each entry the index lists, whatever the entry
    holds: settled and listed from its row, settled with a row that says too little (no ``has_children``,
    an outcome this build does not know, no mode), settled with a file written or cut since, live, never
    settled, not a subagent. A listing may take a settled row a quicker way; never to another answer."""
    store.create_session(st, "r", created_at=OLD)
    settled_child(st, "r", "plain", owner)
    settled_child(st, "r", "failed", owner, turn=FAILED)
    settled_child(st, "r", "parent", owner, grandchild="g")
    settled_child(st, "r", "cont", owner, descriptor=CONTINUABLE)
    for name in ("no-kids-field", "unknown-outcome", "no-mode", "written", "cut"):
        settled_child(st, "r", name, owner)
    make_child(st, "r", "live", lease_owner=owner)
    make_child(st, "r", "never", created_at=OLD)
    store.create_session(st, "user-child", parent_session="r", origin=None, created_at=OLD)
    store.add_child(st, "r", "user-child", created_at=OLD, origin=None)
    edits = {"no-kids-field": lambda r: {k: v for k, v in r.items() if k != "has_children"},
             "unknown-outcome": lambda r: {**r, "outcome": "vanished"}}
    records = [edits[r["id"]](r) if r["id"] in edits and r.get("state") == "settled" else r for r in index_records(st, "r")]
    records = [{k: v for k, v in r.items() if k != "mode"} if r["id"] == "no-mode" and "created_at" in r else r for r in records]
    write_file(st.children_index_path("r"), b"".join(encode_record(r) for r in records))
    later = os.stat(st.session_path("written")).st_mtime_ns + 5_000_000
    os.utime(st.session_path("written"), ns=(later, later))
    os.truncate(st.session_path("cut"), 600)
    owners = store.OwnerCache(st)
    expected = [row for e in catalog.listed_children(st, "r") if e.origin == "subagent"
                if (row := catalog._entry(st, "r", e, owners)) is not None]
    rows = store.list_children(st, "r")
    assert rows == expected and [r.created_at for r in rows] == [r.created_at for r in expected]
    assert [(r.id, r.kind) for r in rows if r.kind == "diagnostic"] == [("cut", "diagnostic")]
    by_id = {r.id: r for r in rows}
    assert by_id["parent"].has_children and not by_id["no-kids-field"].has_children
    assert by_id["live"].status == "running" and by_id["failed"].error_code == "BOOM"
