"""The store's public functions refuse arguments of the wrong type with a code, before they read or change a byte.

Found by a probe of the library API (the ``Supervisor`` methods already refused these):

* ``collect(..., dry_run=None)`` deleted: any false value that was no ``bool`` ran a real collection.
* ``find_roots`` checked ``limit`` only on its sorted path: newest first, ``limit=0`` gave an empty page
  with a cursor, ``limit=-1`` a bare ``IndexError``, ``limit=2.5`` a bare ``TypeError``.
* ``list_children``, ``list_descendants`` and ``find_roots`` took a ``dict`` or a string as ``query``
  (a bare ``AttributeError`` once there was a row to match, an empty answer before); ``summarize`` and
  ``list_descendants`` took a list as the session id (a bare ``TypeError: unhashable type``).
* A cursor that decodes but holds values of the wrong types (hand-edited) was a bare ``TypeError``, which
  ``subagents ls --cursor`` printed as ``INTERNAL``; a cursor that is no text too.
* ``Store(None)``, ``parse_age(None)``: bare ``TypeError``s.
* ``Query(since=10**400)`` and ``collect(10**400)``: a bare ``OverflowError`` from ``math.isfinite``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from subagents import store
from subagents.store import InvalidQueryError, Query, SubagentError
from subagents.store.session import NewSession, create_sessions

from ..conftest import REPO_ROOT, disk_snapshot
from ._support import make_child


@pytest.fixture
def tree(st: store.Store) -> store.Store:
    """Three roots; ``r1`` has two subagent children, one of them a parent."""
    for i in range(3):
        store.create_session(st, f"r{i}", label=f"job-{i}", created_at=100.0 + i)
    make_child(st, "r1", "c1", created_at=200.0)
    make_child(st, "r1", "c2", created_at=201.0)
    make_child(st, "c1", "g1", created_at=300.0, delegation_depth=2)
    return st


def _cursor(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


@pytest.mark.parametrize("dry_run", [None, 0, "", "no", 1])
def test_collect_refuses_a_dry_run_that_is_no_bool_and_deletes_nothing(tree: store.Store, dry_run: object) -> None:
    before = disk_snapshot(tree)
    with pytest.raises(InvalidQueryError, match="dry_run"):
        store.collect(tree, 0, dry_run=dry_run)  # type: ignore[arg-type]
    assert disk_snapshot(tree) == before
    assert [row.id for row in store.list_roots(tree)] == ["r0", "r1", "r2"]


@pytest.mark.parametrize("limit", [0, -1, 2.5, "3", True])
@pytest.mark.parametrize("order", [{}, {"sort": "label"}, {"newest_first": False}])
def test_find_roots_refuses_a_limit_that_is_no_positive_whole_number_on_every_path(tree: store.Store, limit: object, order: dict) -> None:
    with pytest.raises(InvalidQueryError, match="limit"):
        store.find_roots(tree, limit=limit, **order)  # type: ignore[arg-type]


WRONG_QUERIES = [{"status": {"running"}}, "running", ["running"], 5]


@pytest.mark.parametrize("query", WRONG_QUERIES, ids=repr)
def test_a_listing_refuses_a_query_that_is_no_query(tree: store.Store, query: object) -> None:
    calls = {
        "list_children": lambda: store.list_children(tree, "r1", query),  # type: ignore[arg-type]
        "list_children of a parent without children": lambda: store.list_children(tree, "r0", query),  # type: ignore[arg-type]
        "list_descendants": lambda: store.list_descendants(tree, "r1", query),  # type: ignore[arg-type]
        "find_roots": lambda: store.find_roots(tree, query=query),  # type: ignore[arg-type]
        "find_roots by label": lambda: store.find_roots(tree, query=query, sort="label"),  # type: ignore[arg-type]
    }
    for name, call in calls.items():
        with pytest.raises(InvalidQueryError, match="query"):
            call()
            pytest.fail(f"{name} took {query!r}")


@pytest.mark.parametrize("session_id", [["a"], {"a": 1}, None, 5], ids=repr)
def test_a_listing_refuses_a_session_id_that_is_no_text(tree: store.Store, session_id: object) -> None:
    calls = [store.list_children, store.list_descendants, store.subagent_count]
    if session_id is not None:  # summarize(store, None) sums up the whole store
        calls.append(store.summarize)
    for call in calls:
        with pytest.raises(SubagentError) as caught:
            call(tree, session_id)  # type: ignore[arg-type]
        assert caught.value.code == "INVALID_SESSION_ID", (call.__name__, caught.value)


HAND_EDITED = {
    "text for a time": (["created", True, ["a", "b"]], {}),
    "too short a key": (["created", True, [1.0]], {}),
    "a list in the key": (["created", True, [[1], "r1"]], {}),
    "numbers for a label": (["label", False, [1, 2, 3]], {"sort": "label", "newest_first": False}),
    "a bool for a time": (["created", False, [True, "r1"]], {"newest_first": False}),
}


@pytest.mark.parametrize("case", list(HAND_EDITED))
def test_a_cursor_with_values_of_the_wrong_types_is_invalid_query(tree: store.Store, case: str) -> None:
    raw, options = HAND_EDITED[case]
    with pytest.raises(InvalidQueryError, match="cursor"):
        store.find_roots(tree, cursor=_cursor(raw), limit=1, **options)


@pytest.mark.parametrize("cursor", [123, b"abc", ["x"]], ids=repr)
def test_a_cursor_that_is_no_text_is_invalid_query(tree: store.Store, cursor: object) -> None:
    for options in ({}, {"sort": "label"}):
        with pytest.raises(InvalidQueryError, match="cursor"):
            store.find_roots(tree, cursor=cursor, limit=1, **options)  # type: ignore[arg-type]


def test_the_cli_names_a_hand_edited_cursor_rather_than_an_internal_error(tree: store.Store) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    done = subprocess.run(
        [sys.executable, "-m", "subagents.supervisor.cli", "--store", tree.root, "ls", "--cursor", _cursor(["created", True, ["a", "b"]])],
        cwd=REPO_ROOT, env={**env, "PYTHONPATH": REPO_ROOT}, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    assert "INVALID_QUERY" in done.stderr and "INTERNAL" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_store_path_that_is_none_is_invalid_request(tmp_path) -> None:
    with pytest.raises(SubagentError) as caught:
        store.Store(None)  # type: ignore[arg-type]
    assert caught.value.code == "INVALID_REQUEST"


@pytest.mark.parametrize("text", [None, 5, b"1h"], ids=repr)
def test_parse_age_refuses_what_is_no_text(text: object) -> None:
    with pytest.raises(InvalidQueryError):
        store.parse_age(text)  # type: ignore[arg-type]


def test_a_number_of_seconds_beyond_a_float_is_refused_not_an_overflow(tree: store.Store) -> None:
    with pytest.raises(InvalidQueryError):
        Query(since=10**400)
    with pytest.raises(InvalidQueryError):
        Query(until=-(10**400))
    with pytest.raises(InvalidQueryError, match="older_than_s"):
        store.collect(tree, 10**400, dry_run=True)


@pytest.mark.parametrize("parent", ["nobody", "orphan"])
def test_a_child_of_a_parent_the_store_does_not_hold_is_refused_before_anything_is_written(tree: store.Store, parent: str) -> None:
    """Found as a probe made a cycle of parents: ``create_session(st, "a", parent_session="b")`` with no ``b``
    wrote ``a`` and an index for ``b``; no listing reached it and no gc collected it. A session naming
    itself as its parent (``orphan`` under ``orphan``) was the same."""
    before = disk_snapshot(tree)
    with pytest.raises(store.SessionNotFoundError) as caught:
        make_child(tree, parent, "orphan", created_at=400.0)
    assert caught.value.session_id == parent
    assert disk_snapshot(tree) == before
    assert not tree.exists("orphan")


def test_a_batch_refuses_only_the_child_whose_parent_is_missing(tree: store.Store) -> None:
    """The rest of the batch is created. A parent made in the same batch is not yet created: a child of it
    is refused too (nothing creates the two together; a parent comes back created before its children start)."""
    child = dict(origin="subagent", delegation_depth=2, events=[("subagent/descriptor", {"mode": "one-shot"})])
    outcomes = create_sessions(tree, [
        NewSession("n1", parent_session="r0", **child),
        NewSession("n2", parent_session="gone", **child),
        NewSession("n3", created_at=500.0),
        NewSession("n4", parent_session="n3", **child),
    ])
    assert [type(o).__name__ for o in outcomes] == ["SessionHeader", "SessionNotFoundError", "SessionHeader", "SessionNotFoundError"]
    assert [tree.exists(s) for s in ("n1", "n2", "n3", "n4")] == [True, False, True, False]
    assert [row.id for row in store.list_children(tree, "r0")] == ["n1"]
    assert list(store.list_children(tree, "n3")) == []
