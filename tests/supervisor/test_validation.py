"""The validation matrix of ``start``: each rejection has its code and leaves nothing on disk.

Every case asserts the ``SubagentError`` code and that ``sessions/`` and
``index/children/`` hold exactly what they held before (the root only).
"""

from __future__ import annotations

import anyio
import pytest

from subagents.supervisor import (
    CancelledBeforeStartError,
    Capabilities,
    ContinuableSpec,
    InvalidRequestError,
    Provider,
    RegistryError,
    RunBudget,
    SubagentDepthError,
    SubagentError,
    SubagentRequest,
    UserAuthority,
)

from subagents.store import read_mailbox

from ..conftest import disk_snapshot, open_supervisor, wait_until
from .test_continuable import continuable_supervisor

pytestmark = pytest.mark.anyio

# Every optional field set, in the reference's capability order.
FULL_REQUEST = dict(
    output_schema={"type": "object"},
    max_depth=3,
    tool_filter={"allow": ["echo"]},
    persona="terse",
    sandbox="read-only",
    budget=RunBudget(max_steps=3),
)
# (capability flag granted at this stage, name expected in the error)
ORDER = [
    ("output_schema", "outputSchema"),
    ("depth_limit", "depthLimit"),
    ("tool_filter", "toolFilter"),
    ("persona", "persona"),
    ("sandbox_mode", "sandboxMode"),
    ("run_budget", "runBudget"),
]


async def test_unsupported_capability_in_reference_order(tmp_path):
    """With every field requested, the first capability the provider lacks is named, in order."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        granted: dict[str, bool] = {}
        for stage, (flag, public) in enumerate(ORDER):
            name = f"p{stage}"
            sup.register_provider(Provider(name=name, program="echo", capabilities=Capabilities(**granted)))
            with pytest.raises(RegistryError) as info:
                await sup.start(name, SubagentRequest(parent=root, prompt="x", **FULL_REQUEST))
            assert info.value.code == "UNSUPPORTED_CAPABILITY"
            assert str(info.value) == f'subagent provider "{name}" does not support the "{public}" capability'
            assert info.value.capability == public
            assert disk_snapshot(sup.store) == before
            granted[flag] = True
        # with every capability the same request is accepted
        sup.register_provider(Provider(name="full", program="echo", capabilities=Capabilities(**granted)))
        run = await sup.start("full", SubagentRequest(parent=root, prompt="{}", **FULL_REQUEST))
        assert (await run.result()).stop_reason == "completed"
        await run.dispose()


@pytest.mark.parametrize("field, value, public", [
    ("output_schema", {"type": "object"}, "outputSchema"),
    ("max_depth", 0, "depthLimit"),
    ("tool_filter", {"deny": ["echo"]}, "toolFilter"),
    ("persona", "p", "persona"),
    ("sandbox", "read-only", "sandboxMode"),
    ("budget", RunBudget(timeout_ms=10), "runBudget"),
])
async def test_each_capability_alone_is_checked(tmp_path, field, value, public):
    """A single requested capability the provider lacks is rejected (a falsy value still counts)."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        sup.register_provider(Provider(name="bare", program="echo"))
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(RegistryError) as info:
            await sup.start("bare", SubagentRequest(parent=root, prompt="x", **{field: value}))
        assert info.value.code == "UNSUPPORTED_CAPABILITY"
        assert info.value.capability == public
        assert disk_snapshot(sup.store) == before


@pytest.mark.parametrize("max_depth", [-1, 1.5, True, "2"])
async def test_invalid_max_depth(tmp_path, max_depth):
    """``max_depth`` must be a non-negative int (bool, float, negative and str are refused)."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", max_depth=max_depth))
        assert info.value.code == "INVALID_REQUEST"
        assert str(info.value) == "subagent maxDepth must be a non-negative safe integer"
        assert isinstance(info.value, ValueError)
        assert disk_snapshot(sup.store) == before


@pytest.mark.parametrize("budget", [
    RunBudget(max_steps=0),
    RunBudget(max_steps=-1),
    RunBudget(timeout_ms=0),
    RunBudget(timeout_ms=-1),
    RunBudget(timeout_ms=2_147_483_648),
])
async def test_invalid_budget(tmp_path, budget):
    """Budgets are positive ints; ``timeout_ms`` is at most 2_147_483_647."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", budget=budget))
        assert info.value.code == "INVALID_REQUEST"
        assert disk_snapshot(sup.store) == before


@pytest.mark.parametrize("fields", [{"max_steps": True}, {"max_steps": "5"}, {"timeout_ms": 5.0}, {"timeout_ms": False}])
async def test_a_budget_of_another_type_is_refused_not_converted(tmp_path, fields):
    """A lax model made ``True`` one step and ``"5"`` or ``5.0`` five, and the child started with them."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError):
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", budget=RunBudget(**fields)))
        with pytest.raises(InvalidRequestError):
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", budget=fields))
        assert disk_snapshot(sup.store) == before


async def test_largest_timeout_is_accepted(tmp_path):
    """``timeout_ms = 2_147_483_647`` is the inclusive upper bound."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="ok", budget=RunBudget(timeout_ms=2_147_483_647, max_steps=2_147_483_648)))
        assert (await run.result()).stop_reason == "completed"
        await run.dispose()


@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "array"}, {}, {"properties": {}}])
async def test_non_object_output_schema(tmp_path, schema):
    """An output schema must be object-rooted."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", output_schema=schema))
        assert info.value.code == "INVALID_REQUEST"
        assert disk_snapshot(sup.store) == before


@pytest.mark.parametrize("value", [object(), float("nan"), 2**70, "\ud800"])
async def test_an_output_schema_that_is_no_json_is_refused_before_the_child_is_made(tmp_path, value):
    """A schema holding an object was a bare ``TypeError`` from the worker pipe, after the child's
    session was made: an orphan listed ``not-started``. ``NaN`` was taken."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", output_schema={"type": "object", "title": value}))
        assert info.value.code == "INVALID_REQUEST" and "output_schema" in str(info.value)
        assert disk_snapshot(sup.store) == before


async def test_invalid_tool_filter(tmp_path):
    """A tool filter must declare allow and/or deny."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", tool_filter={}))
        assert info.value.code == "INVALID_REQUEST"
        assert disk_snapshot(sup.store) == before
        # found by a probe: pydantic's own report, on several lines, with a link, where other fields say one line
        with pytest.raises(InvalidRequestError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", tool_filter={"allow": ["read_file"], "bogus": []}))
        assert info.value.message == "tool_filter is invalid: bogus: Extra inputs are not permitted", info.value.message
        assert disk_snapshot(sup.store) == before


async def test_depth_exceeded(tmp_path):
    """``max_depth=0`` forbids delegation from a root: SubagentDepthError(1, 0) with the reference's text."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(SubagentDepthError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", max_depth=0))
        err = info.value
        assert err.code == "DEPTH_EXCEEDED"
        assert isinstance(err, SubagentError)
        assert (err.attempted_depth, err.max_depth) == (1, 0)
        assert str(err) == "subagent depth 1 exceeds maxDepth 0"
        assert disk_snapshot(sup.store) == before
        # max_depth equal to the child's depth is allowed (an absolute cap)
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="x", max_depth=1))
        assert (await run.result()).stop_reason == "completed"
        await run.dispose()


async def test_depth_exceeded_inside_a_child_crosses_the_pipe(tmp_path):
    """A child at depth 1 spawning with max_depth=1 ends ``error`` with the DEPTH_EXCEEDED diagnostic."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        prompt = '[{"spawn": {"prompt": "x", "provider": "echo", "max_depth": 1}}]'
        run = await sup.start("script", SubagentRequest(parent=root, prompt=prompt))
        with anyio.fail_after(20):
            result = await run.result()
        await run.dispose()
        assert result.stop_reason == "error"
        assert result.diagnostic == "DEPTH_EXCEEDED: subagent depth 2 exceeds maxDepth 1"
        assert await sup.list_children(run.id) == []


# (model, fields beside the valid ones, the message): a field of the wrong type
WRONG_TYPES = [
    (SubagentRequest, {"label": []}, "invalid SubagentRequest: label: Input should be a valid string"),
    (SubagentRequest, {"persona": 3}, "invalid SubagentRequest: persona: Input should be a valid string"),
    (SubagentRequest, {"budget": {"max_steps": "many"}},
     "invalid SubagentRequest: budget.max_steps: Input should be a valid integer"),
    (SubagentRequest, {"tool_filter": {"allow": "echo"}}, "invalid SubagentRequest: tool_filter.allow: Input should be a valid list"),
    (SubagentRequest, {"colour": "red"}, "invalid SubagentRequest: colour: Extra inputs are not permitted"),
    (ContinuableSpec, {"label": []}, "invalid ContinuableSpec: label: Input should be a valid string"),
    (ContinuableSpec, {"provider": 5}, "invalid ContinuableSpec: provider: Input should be a valid string"),
    (ContinuableSpec, {"child_id": ["c"]}, "invalid ContinuableSpec: child_id: Input should be a valid string"),
    (RunBudget, {"timeout_ms": "soon"},
     "invalid RunBudget: timeout_ms: Input should be a valid integer"),
]
VALID = {SubagentRequest: {"parent": "01P", "prompt": "x"}, ContinuableSpec: {"parent": "01P", "provider": "script", "prompt": "x", "label": "w"}, RunBudget: {}}


@pytest.mark.parametrize("model, fields, message", WRONG_TYPES, ids=[f"{m.__name__}-{next(iter(f))}" for m, f, _ in WRONG_TYPES])
def test_a_field_of_the_wrong_type_is_an_invalid_request(model, fields, message):
    """Issue a: pydantic's ValidationError (no ``code``) escaped; the request models raise INVALID_REQUEST."""
    with pytest.raises(InvalidRequestError) as info:
        model(**{**VALID[model], **fields})
    assert (info.value.code, str(info.value)) == ("INVALID_REQUEST", message)
    assert info.value.field == message.split(": ")[1]


async def test_a_wrong_field_type_from_a_child_crosses_the_pipe(tmp_path):
    """A child's ``spawn`` with a field of the wrong type ends ``error`` naming INVALID_REQUEST, and nothing is created."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        prompt = '[{"spawn": {"prompt": "x", "provider": "echo", "persona": 3}}]'
        run = await sup.start("script", SubagentRequest(parent=root, prompt=prompt))
        with anyio.fail_after(20):
            result = await run.result()
        await run.dispose()
        assert result.stop_reason == "error"
        assert result.diagnostic == "INVALID_REQUEST: invalid SubagentRequest: persona: Input should be a valid string"
        assert await sup.list_children(run.id) == []


async def test_unknown_parent(tmp_path):
    """A parent with no session is refused before anything is written."""
    async with open_supervisor(tmp_path) as sup:
        await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(SubagentError) as info:
            await sup.start("echo", SubagentRequest(parent="01NOSUCHPARENT", prompt="x"))
        assert info.value.code == "NO_PARENT"
        assert disk_snapshot(sup.store) == before


async def test_cancel_set_before_start(tmp_path):
    """A cancel token already set: CANCELLED, no session, no index entry, no events."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        seen: list[str] = []
        sup.on("subagent/start", lambda n, p: seen.append(n))
        before = disk_snapshot(sup.store)
        cancel = anyio.Event()
        cancel.set()
        with pytest.raises(CancelledBeforeStartError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x"), cancel=cancel)
        assert info.value.code == "CANCELLED"
        assert disk_snapshot(sup.store) == before
        assert seen == []
        assert sup.statistics().runs_live == 0


@pytest.mark.parametrize("prompt", [object(), {1, 2}, float("nan")])
async def test_a_prompt_that_is_no_text_nor_json_is_invalid_request(tmp_path, prompt):
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt=prompt))
        assert info.value.code == "INVALID_REQUEST"
        assert disk_snapshot(sup.store) == before


WRONG_TYPES = {
    "start(None)": lambda sup, root: sup.start("echo", None),
    "start(cancel=5)": lambda sup, root: sup.start("echo", SubagentRequest(parent=root, prompt="x"), cancel=5),
    "start_continuable(None)": lambda sup, root: sup.start_continuable(None),
    "interrupt(authority=None)": lambda sup, root: sup.interrupt(root.id, authority=None),
    "list_children(query='x')": lambda sup, root: sup.list_children(root.id, "x"),
    "list_descendants(query='x')": lambda sup, root: sup.list_descendants(root.id, "x"),
    "drain(None)": lambda sup, root: sup.drain(None),
    "drain([5])": lambda sup, root: sup.drain([5]),
    "open_root(label=5)": lambda sup, root: sup.open_root(label=5),
    "open_root(id=5)": lambda sup, root: sup.open_root(id=5),
    "drain([[root]])": lambda sup, root: sup.drain([[root.id]]),
    "drain_children(root, 'id')": lambda sup, root: sup.drain_children(root, "01J0000000000000000000000A"),
    "drain_children([root], [id])": lambda sup, root: sup.drain_children([root], ["01J0000000000000000000000A"]),
    "drain_children(root, [5])": lambda sup, root: sup.drain_children(root, [5]),
    "interrupt(wait_s='1')": lambda sup, root: sup.interrupt(root.id, authority=UserAuthority(root.id), wait_s="1"),
    "interrupt(wait_s=nan)": lambda sup, root: sup.interrupt(root.id, authority=UserAuthority(root.id), wait_s=float("nan")),
    "interrupt(wait_s=-5)": lambda sup, root: sup.interrupt(root.id, authority=UserAuthority(root.id), wait_s=-5),
    "interrupt(wait_s=None)": lambda sup, root: sup.interrupt(root.id, authority=UserAuthority(root.id), wait_s=None),
    "wait_for_message(timeout_s=nan)": lambda sup, root: sup.wait_for_message(root, timeout_s=float("nan")),
    "wait_for_message(timeout_s='1')": lambda sup, root: sup.wait_for_message(root, timeout_s="1"),
    "wait_for_message(timeout_s=-1)": lambda sup, root: sup.wait_for_message(root, timeout_s=-1),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
async def test_an_argument_of_the_wrong_type_is_invalid_request(tmp_path, case):
    """Each was a bare ``AttributeError``, ``TypeError`` or ``ValueError`` from deep inside the call."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            await WRONG_TYPES[case](sup, root)
        assert info.value.code == "INVALID_REQUEST"
        assert disk_snapshot(sup.store) == before


async def test_a_one_shot_may_start_under_a_root_another_supervisor_holds(tmp_path):
    """The documented rule (README, choices): a one-shot ``start`` takes any parent session the store holds;
    the child is listed under it with its depth, while ``start_continuable`` needs the exact live parent."""
    async with open_supervisor(tmp_path) as first, open_supervisor(tmp_path) as second:
        root = await first.open_root(label="held by the first")
        run = await second.start("echo", SubagentRequest(parent=root.id, prompt="hi"))
        with anyio.fail_after(20):
            assert (await run.result()).output == "hi"
        await run.dispose()
        [row] = await first.list_children(root.id)
        assert row.id == run.id
        second.register_provider(Provider(name="cont", program="script", capabilities=Capabilities.all(), continuable=True))
        with pytest.raises(SubagentError) as info:
            await second.start_continuable(ContinuableSpec(parent=root.id, provider="cont", prompt="[]", label="w"))
        assert info.value.code == "UNAUTHORIZED"


@pytest.mark.parametrize("call", ["register_provider", "report_from"])
async def test_a_closed_supervisor_refuses_every_call(tmp_path, call):
    """These two answered as if open: ``register_provider`` registered, ``report_from`` said ``UNAUTHORIZED``."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
    with pytest.raises(SubagentError) as info:
        if call == "register_provider":
            sup.register_provider(Provider(name="late", program="echo"))
        else:
            await sup.report_from(root.id, "late")
    assert info.value.code == "SUPERVISOR_CLOSED"


async def test_wait_for_message_with_no_time_left_still_takes_what_is_there(tmp_path):
    """``timeout_s=0`` timed out before it read the mailbox, even with a message waiting in it."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        with pytest.raises(SubagentError) as info:
            await sup.wait_for_message(root, timeout_s=0)
        assert info.value.code == "TIMEOUT"
        child_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="echo", prompt="hi", label="c"))
        await wait_until(lambda: len(read_mailbox(sup.store, root.id)) == 1, what="the settlement notice")
        [notice] = await sup.wait_for_message(root, timeout_s=0)
        assert notice.source.get("sender_session_id") == child_id


UNSENDABLE = [
    ({"budget": RunBudget(max_steps=2**64)}, "budget max_steps must be a positive safe integer"),
    ({"budget": RunBudget(max_steps=2**53)}, "budget max_steps must be a positive safe integer"),
    ({"max_depth": 2**53}, "subagent maxDepth must be a non-negative safe integer"),
    ({"persona": "\ud800"}, "persona must be text UTF-8 can hold"),
    ({"model": "terse\udfff"}, "model must be text UTF-8 can hold"),
    ({"tool_filter": {"allow": ["\ud800"]}}, "tool_filter must be text UTF-8 can hold"),
]


@pytest.mark.parametrize("fields, message", UNSENDABLE, ids=[next(iter(f)) + str(i) for i, (f, _) in enumerate(UNSENDABLE)])
async def test_a_field_no_message_to_a_worker_holds_is_refused_before_the_child_is_made(tmp_path, fields, message):
    """A ``max_steps`` of 2**64 or a persona holding a lone surrogate passed every check and failed as
    the turn was encoded for its worker: a bare ``OverflowError`` after the child was made (or, queued
    behind another turn, an exception that ended the whole supervisor). Found by a probe."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x", **fields))
        assert info.value.code == "INVALID_REQUEST" and str(info.value).startswith(message), str(info.value)
        assert disk_snapshot(sup.store) == before


@pytest.mark.parametrize("fields, message", UNSENDABLE, ids=[next(iter(f)) + str(i) for i, (f, _) in enumerate(UNSENDABLE)])
async def test_a_continuable_field_no_message_holds_is_refused_before_the_child_is_made(tmp_path, fields, message):
    """The same for ``start_continuable``: it accepted them, its first turn failed in the driver with a
    false failure notice, and was then resumed without its budget."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt="x", label="c", **fields))
        assert info.value.code == "INVALID_REQUEST" and str(info.value).startswith(message), str(info.value)
        assert disk_snapshot(sup.store) == before


async def test_the_largest_safe_budget_and_depth_are_accepted(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="ok", max_depth=2**53 - 1, budget=RunBudget(max_steps=2**53 - 1)))
        assert (await run.result()).stop_reason == "completed"
        await run.dispose()
