"""A child started under a child that has already settled (found by a probe).

README: a one-shot ``start`` takes any parent session the store holds. Under a settled child, whose
settled row in its own parent's children index says ``has_children=False``, the new child left that
row stale: ``list_children`` said the parent had no children, and ``store check`` reported an
``index-row`` violation on a store nothing damaged (a 500-deep chain built so: 499 of them).

The creation under the settled parent (``create_under_settled_parent``, under the parent's lock) now
marks the parent's row ``active`` (durably) before it creates the child, and appends the row again
with ``has_children=True`` after: a kill between leaves an ``active`` row (listed from the files,
which are right), never a stale one. A store an earlier version left with such a row: ``fsck
--repair`` appends the row again, right (``row-stale``), and ``store check`` says so.
"""

from __future__ import annotations

import pytest

from subagents import store
from subagents.store.fsck import fsck
from subagents.store.index import mark_active, mark_settled
from subagents.store.session import NewSession, create_sessions, create_under_settled_parent
from subagents.supervisor import SubagentRequest
from subagents.testing import check_store
from tests.store._support import ONE_SHOT

from ..conftest import open_supervisor

pytestmark = pytest.mark.anyio


async def _settled_chain(sup, depth: int) -> tuple[str, list[str]]:
    """A root, and ``depth`` one-shot children each started under the previous one once it settled."""
    root = await sup.open_root(label="r")
    parent, chain = root, []
    for level in range(depth):
        run = await sup.start("echo", SubagentRequest(parent=parent, prompt=f"level {level}", label=f"l{level}"))
        assert (await run.result()).output == f"level {level}"
        await run.dispose()
        chain.append(run.id)
        parent = run.id
    return root.id, chain


def _row(st: store.Store, parent: str, child: str):
    [entry] = [e for e in store.read_children(st, parent) if e.id == child]
    return entry


async def test_a_child_started_under_a_settled_child_leaves_its_row_saying_it_has_children(tmp_path) -> None:
    """The probe's scenario: root → a (settled) → b."""
    async with open_supervisor(tmp_path) as sup:
        root, [a, b] = await _settled_chain(sup, 2)
        rows = await sup.list_children(root)
    st = store.Store(str(tmp_path / "store"), create=False)
    assert [(r.id, r.has_children) for r in rows] == [(a, True)]
    assert [(r.id, r.has_children) for r in store.list_children(st, root)] == [(a, True)]
    assert [r.id for r in store.list_children(st, a)] == [b]
    row = _row(st, root, a)
    assert row.settled is not None and row.settled.has_children is True, row  # still listed from the row alone
    report = check_store(st, in_flight_s=0.0)
    assert report.clean, str(report)


async def test_a_chain_of_settled_children_five_deep_lists_and_checks_clean(tmp_path) -> None:
    async with open_supervisor(tmp_path) as sup:
        root, chain = await _settled_chain(sup, 5)
    st = store.Store(str(tmp_path / "store"), create=False)
    parents = [root, *chain[:-1]]
    for parent, child in zip(parents, chain):
        [row] = store.list_children(st, parent)
        assert (row.id, row.has_children) == (child, child != chain[-1]), parent
        entry = _row(st, parent, child)
        assert entry.settled is not None and entry.settled.has_children is (child != chain[-1]), entry
    report = check_store(st, in_flight_s=0.0)
    assert report.clean, str(report)
    assert not [f for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] == "row-stale"]


async def test_a_second_child_under_the_same_settled_parent_writes_no_row(tmp_path) -> None:
    """Once the row says it has children, a further child under it changes nothing in the grandparent's index."""
    async with open_supervisor(tmp_path) as sup:
        root, [a, _b] = await _settled_chain(sup, 2)
    st = store.Store(str(tmp_path / "store"), create=False)
    path = st.children_index_path(root)
    with open(path, "rb") as handle:
        before = handle.read()
    create_under_settled_parent(st, NewSession("second", parent_session=a, origin="subagent", delegation_depth=2,
                                               events=[("subagent/descriptor", dict(ONE_SHOT))]))
    with open(path, "rb") as handle:
        assert handle.read() == before
    assert sorted(e.id for e in store.read_children(st, a)) == sorted([_b, "second"])


async def test_a_kill_between_the_active_row_and_the_settled_row_leaves_a_store_check_accepts(tmp_path) -> None:
    """The creation's writes, made one by one with the store's functions, stopping where a kill would:
    after the parent's ``active`` row (no child yet), and after the child's creation (no ``settled`` row
    again). Both list right, from the parent's files, and check clean with no repair."""
    async with open_supervisor(tmp_path) as sup:
        root, [a] = await _settled_chain(sup, 1)
    st = store.Store(str(tmp_path / "store"), create=False)
    mark_active(st, root, a)  # first write: killed right after it
    assert [(r.id, r.has_children) for r in store.list_children(st, root)] == [(a, False)]
    assert _row(st, root, a).settled is None
    report = check_store(st, in_flight_s=0.0)
    assert report.clean, str(report)
    [outcome] = create_sessions(st, [NewSession("kid", parent_session=a, origin="subagent", delegation_depth=2,
                                                events=[("subagent/descriptor", dict(ONE_SHOT))])])
    assert not isinstance(outcome, BaseException), outcome  # second write: killed right after it
    assert [(r.id, r.has_children) for r in store.list_children(st, root)] == [(a, True)]
    report = check_store(st, in_flight_s=0.0)
    assert report.clean, str(report)
    assert not [f for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] == "row-stale"]


async def test_fsck_repair_fixes_the_stale_row_an_earlier_version_left(tmp_path) -> None:
    """An earlier version created the child under the settled parent without touching its row (today's
    creation writes it again: the row it wrote first is put back): check names the violation and its
    fix; fsck reports it and ``--repair`` appends the row again, with ``has_children=True``."""
    async with open_supervisor(tmp_path) as sup:
        root, [a] = await _settled_chain(sup, 1)
    st = store.Store(str(tmp_path / "store"), create=False)
    before = _row(st, root, a).settled
    [outcome] = create_sessions(st, [NewSession("kid", parent_session=a, origin="subagent", delegation_depth=2,
                                                events=[("subagent/descriptor", dict(ONE_SHOT))])])
    assert not isinstance(outcome, BaseException), outcome
    assert _row(st, root, a).settled.has_children is True
    mark_settled(st, root, a, before)
    assert _row(st, root, a).settled.has_children is False  # the stale row
    report = check_store(st, in_flight_s=0.0)
    [violation] = report.violations
    assert (violation.session_id, violation.kind) == (a, "index-row"), str(report)
    assert "fsck --repair" in violation.evidence, violation.evidence
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    [stale] = [f for f in found["findings"] if f["kind"] == "row-stale"]
    assert stale["id"] == a and not stale.get("repaired") and _row(st, root, a).settled.has_children is False
    repaired = fsck(st, repair=True, lease_ttl_s=5.0)
    [stale] = [f for f in repaired["findings"] if f["kind"] == "row-stale"]
    assert stale["repaired"] and a in repaired["repaired"], stale
    row = _row(st, root, a)
    assert row.settled is not None and row.settled.has_children is True, row
    assert [(r.id, r.has_children) for r in store.list_children(st, root)] == [(a, True)]
    report = check_store(st, in_flight_s=0.0)
    assert report.clean, str(report)
    assert not [f for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] == "row-stale"]
