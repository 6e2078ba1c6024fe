"""A fork provider seeds the child with its parent's completed-turn prefix (seed_length)."""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator

import anyio
import pytest

from subagents.store import describe_session, fold_resume_descriptor, inspect, read_header, read_projection
from subagents.store.index import IndexEntry
from subagents.supervisor import AgentRef, Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig

pytestmark = pytest.mark.anyio


def own_turn_ends(sup: Supervisor, session_id: str) -> list[dict[str, Any]]:
    """The ``turn/end`` records of the session's own turns (after its seed, if it is a fork)."""
    seed = read_header(sup.store, session_id).seed_length or 0
    return [e for e in inspect(sup.store, session_id).events[seed:] if e["type"] == "turn/end"]


async def turns_ended(sup: Supervisor, session_id: str, count: int) -> list[dict[str, Any]]:
    with anyio.fail_after(20):
        while len(ends := own_turn_ends(sup, session_id)) < count:
            await anyio.sleep(0.02)
    return ends


@contextlib.asynccontextmanager
async def forked(tmp_path) -> AsyncIterator[tuple[Supervisor, AgentRef, str, IndexEntry]]:
    """A root, a continuable parent, and the fork its second turn started, once the fork ended its first turn."""
    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        caps = Capabilities.all()
        sup.register_provider(Provider(name="script", program="script", capabilities=caps, continuable=True))
        sup.register_provider(Provider(name="fork", program="script", capabilities=caps, continuable=True, inherits_parent_context=True))
        root = await sup.open_root()
        parent_id, _ = await sup.start_continuable(
            ContinuableSpec(parent=root, provider="script", label="parent", prompt=json.dumps({"script": [{"return": "first turn"}]}))
        )
        await turns_ended(sup, parent_id, 1)
        second = {"script": [{"start_continuable": {"prompt": {"script": [{"return": "forked"}]}, "label": "forked", "provider": "fork"}},
                             {"return": "second turn"}]}
        await sup.followup(root, parent_id, json.dumps(second))
        await turns_ended(sup, parent_id, 2)
        (fork,) = [r.entry for r in await sup.list_descendants(root.id) if r.depth == 2]
        await turns_ended(sup, fork.id, 1)
        yield sup, root, parent_id, fork


async def test_fork_child_inherits_the_completed_prefix_and_folds_its_own_descriptor(tmp_path) -> None:
    async with forked(tmp_path) as (sup, _root, parent_id, fork):
        parent_events = inspect(sup.store, parent_id).events
        first_end = next(i for i, e in enumerate(parent_events) if e["type"] == "turn/end")
        header = read_header(sup.store, fork.id)
        child_events = inspect(sup.store, fork.id).events
        assert header.seed_length == first_end + 1
        assert [(e["type"], e["data"]) for e in child_events[: header.seed_length]] == [
            (e["type"], e["data"]) for e in parent_events[: first_end + 1]
        ]
        # the seed holds the parent's descriptor; resume folds only the child's own suffix
        seq, own = fold_resume_descriptor(child_events, header.seed_length)
        assert seq >= header.seed_length and own.label == "forked" and own.provider == "fork"
        assert read_projection(sup.store, fork.id).continuable().label == "forked"
        assert (fork.label, fork.mode) == ("forked", "continuable")


async def test_a_fork_with_a_seed_runs_its_followups(tmp_path) -> None:
    """Found by a probe: the seed's ``message/accepted`` records (what the source consumed from its own
    mailbox) were counted as the fork's own: every message sent to the fork was acknowledged and never run
    (its driver failed with "mailbox and log disagree"), and ``show`` said its mailbox failed validation.
    A fork's projection counts only what it consumed from its own mailbox, and only its own turns."""
    async with forked(tmp_path) as (sup, _root, parent_id, fork):
        own_turns = len(own_turn_ends(sup, fork.id))
        message_id = await sup.send(fork.id, json.dumps({"script": [{"return": "followed up"}]}), parent=parent_id)
        ends = await turns_ended(sup, fork.id, own_turns + 1)
        assert ends[-1]["data"]["stop_reason"] == "completed", ends[-1]
        projection = read_projection(sup.store, fork.id)
        assert projection.consumed == own_turns + 1 and projection.last_message_id == message_id
        assert projection.turns == own_turns + 1  # its own turns: the seed's are its source's (show said 3 for 1)
        mailbox = describe_session(sup.store, fork.id).mailbox
        assert (mailbox.accepted, mailbox.pending, mailbox.problem) == (own_turns + 1, 0, None), mailbox


async def test_a_fork_marks_where_its_inherited_seed_ends(tmp_path) -> None:
    """Found by a probe: ``subagents log`` of a fork began with its source's turns (its descriptor and
    replies) and nothing said where the fork's own log began; the seed is now closed by one
    ``session/end-seed`` after the fork's descriptor, as the reference's session closes a seed, and before
    its first message."""
    async with forked(tmp_path) as (sup, _root, _parent_id, fork):
        seed = read_header(sup.store, fork.id).seed_length
        own = [e["type"] for e in inspect(sup.store, fork.id).events[seed:]]
        assert own.count("session/end-seed") == 1, own
        assert own.index("session/end-seed") < own.index("message/accepted"), own
        # the source was no fork: it has no marker
        assert all(e["type"] != "session/end-seed" for e in inspect(sup.store, _parent_id).events)


async def test_a_fork_opens_its_own_events_with_its_descriptor_then_the_seed_marker_then_its_policy(tmp_path) -> None:
    """The reference seeds a fork with its source's prefix and the fork's descriptor, the session closes that
    seed, and the delegated policy comes after: the descriptor at ``seq == seed_length``. Ours wrote
    ``approval/policy`` first, then the descriptor, then ``session/end-seed`` (found by a probe comparing the
    two logs). A child that is no fork keeps its order (policy, descriptor) and has no marker."""
    async with forked(tmp_path) as (sup, _root, parent_id, fork):
        seed = read_header(sup.store, fork.id).seed_length
        own = [e["type"] for e in inspect(sup.store, fork.id).events[seed:]]
        assert own[:4] == ["subagent/descriptor", "session/end-seed", "approval/policy", "message/accepted"], own
        plain = [e["type"] for e in inspect(sup.store, parent_id).events]
        assert plain[:3] == ["approval/policy", "subagent/descriptor", "message/accepted"], plain
