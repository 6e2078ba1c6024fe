"""Wrong-typed arguments are ``SubagentError``s with a code, before anything is made; a closed supervisor answers nothing.

Found by a probe (``repro_bare_typeerrors.py``):

* ``report_from(["x"], ...)``, ``get_provider(["x"])``, ``start(["x"], ...)`` and ``gc(..., outcomes=None)``
  escaped as a bare ``TypeError`` (``unhashable type``, ``not iterable``); ``start(None, ...)`` said
  ``NO_PROVIDER "None"`` and ``UserAuthority(None)`` was taken as a caller and answered. Each is now
  ``INVALID_REQUEST``: the code a ``Supervisor`` argument of the wrong type has.
* ``Query(since="x")``, ``Query(label=5)``, ``Query(outcome=None)`` failed only inside a listing, as a bare
  ``TypeError``; ``Query(status="running")`` was read letter by letter ("unknown status g, i, n, r, u").
  A ``Query`` refuses its own fields as it is built, with the code of every other refusal of a query
  (``INVALID_QUERY``, the store's: the store imports no supervisor error).
* ``send``, ``followup`` and ``interrupt`` with a child id that is no text (a list, ``None``) said
  ``INVALID_SESSION_ID``, the code for text that is no id; they are ``INVALID_REQUEST`` as ``report_from`` is.
* A closed supervisor still answered ``get_provider``, ``providers()`` and ``statistics()``.
* ``open_root(label=...)`` took a 20 MiB label (a 20 MiB header every listing reads) and a lone surrogate
  (``INVALID_RECORD``), which a child's label is refused for (``LABEL_TOO_LARGE``, ``INVALID_REQUEST``).
"""

from __future__ import annotations

import json
import os

import pytest

from subagents.store import InvalidQueryError, Query, SubagentError, collect, list_children
from subagents.supervisor import AgentRef, AncestorAuthority, ContinuableSpec, InvalidRequestError, SubagentRequest, Supervisor, UserAuthority

from subagents.supervisor.errors import ConfigError

from ..conftest import disk_snapshot, open_supervisor

pytestmark = pytest.mark.anyio

WRONG_TYPES = {
    "report_from(['x'], ...)": lambda sup, root: sup.report_from(["x"], "hi"),
    "report_from(None, ...)": lambda sup, root: sup.report_from(None, "hi"),
    "get_provider(['x'])": lambda sup, root: sup.get_provider(["x"]),
    "get_provider(None)": lambda sup, root: sup.get_provider(None),
    "start(None, ...)": lambda sup, root: sup.start(None, SubagentRequest(parent=root, prompt="x")),
    "start(['x'], ...)": lambda sup, root: sup.start(["x"], SubagentRequest(parent=root, prompt="x")),
    "gc(outcomes=None)": lambda sup, root: sup.gc(1e9, outcomes=None),
    "gc(outcomes=[5])": lambda sup, root: sup.gc(1e9, outcomes=[5]),
    "gc(outcomes='completed')": lambda sup, root: sup.gc(1e9, outcomes="completed"),
    "gc('x')": lambda sup, root: sup.gc("x"),
    "gc(None)": lambda sup, root: sup.gc(None),
    "gc(True)": lambda sup, root: sup.gc(True),  # a bool is an int to isinstance: it was the store's INVALID_QUERY
    "gc(dry_run='no')": lambda sup, root: sup.gc(1e9, dry_run="no"),
    # a child id that is no text was INVALID_SESSION_ID ("is not a valid session id"): that code says the text is wrong
    "send(['x'], ...)": lambda sup, root: sup.send(["x"], "hi", parent=root),
    "send(None, ...)": lambda sup, root: sup.send(None, "hi", parent=root),
    "followup(root, ['x'], ...)": lambda sup, root: sup.followup(root, ["x"], "hi"),
    "followup(root, 5, ...)": lambda sup, root: sup.followup(root, 5, "hi"),
    "interrupt(['x'])": lambda sup, root: sup.interrupt(["x"], authority=UserAuthority(root.id)),
    "interrupt(None)": lambda sup, root: sup.interrupt(None, authority=UserAuthority(root.id)),
    # an AgentRef checks nothing as it is built: an id that is no text was a bare unhashable TypeError inside
    "start(parent=AgentRef(['x']))": lambda sup, root: sup.start("echo", SubagentRequest(parent=AgentRef(["x"]), prompt="x")),
    "start_continuable(parent=AgentRef(['x']))":
        lambda sup, root: sup.start_continuable(ContinuableSpec(parent=AgentRef(["x"]), provider="echo", prompt="x")),
    "followup(AgentRef(['x']), ...)": lambda sup, root: sup.followup(AgentRef(["x"]), "c", "hi"),
    "take_messages(AgentRef({}))": lambda sup, root: sup.take_messages(AgentRef({})),
    "take_messages(AgentRef(None))": lambda sup, root: sup.take_messages(AgentRef(None)),
    # seconds past a float's range: a bare OverflowError from math.isfinite
    "wait_for_message(timeout_s=10**400)": lambda sup, root: sup.wait_for_message(root, timeout_s=10**400),
    "interrupt(wait_s=10**400)": lambda sup, root: sup.interrupt(root.id, authority=UserAuthority(root.id), wait_s=10**400),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
async def test_a_supervisor_argument_of_the_wrong_type_is_invalid_request(tmp_path, case) -> None:
    """Each was a bare ``TypeError``, another code (``NO_PROVIDER``), or was taken (``gc(dry_run="no")`` ran)."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as refused:
            answer = WRONG_TYPES[case](sup, root)
            if hasattr(answer, "__await__"):
                await answer
        assert refused.value.code == "INVALID_REQUEST", refused.value
        assert disk_snapshot(sup.store) == before


async def test_gc_keeps_refusing_a_bad_value_as_invalid_query(tmp_path) -> None:
    """The right type with a value the store's rules refuse stays the store's ``INVALID_QUERY``, as ``subagents gc`` says it."""
    async with open_supervisor(tmp_path) as sup:
        for call in (lambda: sup.gc(-1), lambda: sup.gc(float("nan")), lambda: sup.gc(1, outcomes=["bogus"])):
            with pytest.raises(InvalidQueryError) as refused:
                await call()
            assert refused.value.code == "INVALID_QUERY"
        assert (await sup.gc(1e9, outcomes={"completed"}, dry_run=True)).collected == ()


@pytest.mark.parametrize("outcomes", [None, [5], 5], ids=["none", "int-item", "int"])
def test_the_stores_collect_refuses_outcomes_that_are_no_collection_of_text(tmp_path, outcomes) -> None:
    """``store.collect(outcomes=None)`` (what ``Supervisor.gc`` hands on) was a bare ``TypeError`` too."""
    from subagents.store import Store

    with pytest.raises(InvalidQueryError):
        collect(Store(tmp_path / "store"), 1e9, outcomes=outcomes, dry_run=True)


@pytest.mark.parametrize(
    "fields",
    [
        {"since": "x"}, {"until": "x"}, {"since": True}, {"since": float("nan")}, {"label": 5}, {"label": b"r*"},
        {"outcome": None}, {"status": None}, {"status": 5}, {"status": {5}}, {"outcome": [None]},
    ],
    ids=repr,
)
def test_a_query_field_of_the_wrong_type_is_refused_as_the_query_is_built(fields) -> None:
    """Each was accepted, then a bare ``TypeError`` inside the listing (or at once, for ``outcome=None``)."""
    with pytest.raises(InvalidQueryError) as refused:
        Query(**fields)
    assert refused.value.code == "INVALID_QUERY"
    assert next(iter(fields)) in str(refused.value), refused.value


@pytest.mark.parametrize("name", ["status", "outcome"])
def test_a_query_refuses_a_lone_string_and_says_how_to_write_it(name) -> None:
    """``Query(status="running")`` said "unknown status g, i, n, r, u": the string was read as its letters."""
    word = "running" if name == "status" else "completed"
    with pytest.raises(InvalidQueryError) as refused:
        Query(**{name: word})
    assert str(refused.value) == f"{name} must be a set of words such as {{{word!r}}}, not the string {word!r}"


def test_a_query_takes_any_collection_of_words_and_keeps_a_frozenset() -> None:
    """A list or a set works as the frozenset the field names, and the query stays hashable (it is frozen)."""
    query = Query(status=["running", "idle"], outcome=("completed",), since=0, until=1.5)
    assert query.status == frozenset({"running", "idle"}) and query.outcome == frozenset({"completed"})
    assert hash(query) == hash(Query(status=frozenset({"idle", "running"}), outcome=frozenset({"completed"}), since=0, until=1.5))


async def test_a_listing_with_a_wrong_query_field_never_reads_the_store(tmp_path) -> None:
    """The probe's calls, end to end: the refusal comes from ``Query`` itself, before ``list_children`` is called."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        for fields in ({"since": "x"}, {"label": 5}, {"outcome": None}):
            with pytest.raises(SubagentError) as refused:
                await sup.list_children(root, Query(**fields))
            assert refused.value.code == "INVALID_QUERY"
        assert list_children(sup.store, root.id, Query(label="r*")) == []


def test_an_authority_of_the_wrong_type_is_invalid_request() -> None:
    """``UserAuthority(None)`` was taken as a caller (an interrupt answered, or ``UNAUTHORIZED``): it is no caller at all."""
    for build in (lambda: UserAuthority(None), lambda: UserAuthority(["root"]), lambda: AncestorAuthority(None)):
        with pytest.raises(InvalidRequestError) as refused:
            build()
        assert refused.value.code == "INVALID_REQUEST"


@pytest.mark.parametrize("build", [
    lambda: SubagentRequest(parent="01M0000000000000000000ROOT", prompt="x", label=b"x"),
    lambda: SubagentRequest(parent="01M0000000000000000000ROOT", prompt="x", persona=b"p"),
    lambda: ContinuableSpec(parent="01M0000000000000000000ROOT", provider=b"script", prompt="x", label="l"),
    lambda: ContinuableSpec(parent="01M0000000000000000000ROOT", provider="script", prompt="x", label=b"l"),
], ids=["label", "persona", "continuable provider", "continuable label"])
def test_a_request_text_field_of_bytes_is_invalid_request(build) -> None:
    """A label (or another text field) of bytes was decoded and taken, by the API and from a program's
    ``ctx.spawn`` alike (a probe): text fields take text only, as every other field of the wrong type."""
    with pytest.raises(InvalidRequestError) as refused:
        build()
    assert refused.value.code == "INVALID_REQUEST"


@pytest.mark.parametrize("call", ["get_provider", "providers", "statistics"])
async def test_a_closed_supervisor_answers_these_calls_with_supervisor_closed(tmp_path, call) -> None:
    """They still answered after close: a provider nothing can run any more, and statistics of a torn-down
    pool (no workers, no runs), which read as the final counts they are not."""
    async with open_supervisor(tmp_path) as sup:
        assert sup.get_provider("echo") is not None
    with pytest.raises(SubagentError) as refused:
        sup.get_provider("echo") if call == "get_provider" else getattr(sup, call)()
    assert refused.value.code == "SUPERVISOR_CLOSED"


async def test_a_root_label_obeys_the_record_limit_a_child_label_obeys(tmp_path) -> None:
    """A 20 MiB root label was taken (into a header every listing reads); a child's is ``LABEL_TOO_LARGE``."""
    huge = "x" * (20 * 1024 * 1024)
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(SubagentError) as child:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", label=huge))
        with pytest.raises(SubagentError) as top:
            await sup.open_root(label=huge)
        assert (child.value.code, top.value.code) == ("LABEL_TOO_LARGE", "LABEL_TOO_LARGE")
        assert top.value.limit == sup.store.max_record_bytes
        assert disk_snapshot(sup.store) == before
        assert len(os.listdir(sup.store.sessions_dir)) == 1


async def test_a_root_label_utf8_cannot_hold_is_refused_as_a_child_label_is(tmp_path) -> None:
    """``open_root(label="\\ud800")`` was ``INVALID_RECORD`` from the header's encoding, a child's ``INVALID_REQUEST``."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as child:
            await sup.start("echo", SubagentRequest(parent=root, prompt=json.dumps("x"), label="\ud800"))
        with pytest.raises(InvalidRequestError) as top:
            await sup.open_root(label="\ud800")
        assert str(top.value) == str(child.value)
        assert disk_snapshot(sup.store) == before


@pytest.mark.parametrize(
    "arguments",
    [{"config_file": 5}, {"env": "x"}, {"env": {5: "x"}}, {"env": {"SUBAGENTS_POOL_SIZE": 2}}, {"env": ["SUBAGENTS_STORE"]}],
    ids=repr,
)
async def test_open_configured_refuses_arguments_of_the_wrong_type_as_config_invalid(tmp_path, arguments) -> None:
    """Each was a bare ``TypeError`` or ``AttributeError`` from inside the configuration loader."""
    arguments = {"env": {"SUBAGENTS_STORE": str(tmp_path / "store")}} | arguments
    with pytest.raises(ConfigError) as refused:
        async with Supervisor.open_configured(**arguments):
            pass
    assert refused.value.code == "CONFIG_INVALID"
    assert not (tmp_path / "store").exists()


async def test_gc_refuses_seconds_past_a_floats_range_as_invalid_query(tmp_path) -> None:
    async with open_supervisor(tmp_path) as sup:
        with pytest.raises(InvalidQueryError):
            await sup.gc(10**400, dry_run=True)
