"""Fencing end to end: a supervisor paused past its lease cannot write after it resumes.

A host (TTL 0.5 s) runs a continuable child whose turn waits on a gate. The
test pauses it with SIGSTOP — the whole process group (a paused machine) or
the supervisor alone (its worker keeps running) — waits until it reads dead,
and takes the child over from a Supervisor here: ``open_root(id=...)`` and a
followup, a cold resume at epoch 2 whose own turn waits on a second gate.
Then it opens the first gate and resumes the paused host. The host's
in-flight turn must be fenced in its worker, and the host must drop the
activation without touching the store (no byte of the child's or the root's
files changes), logging it once for that session. The log never shows an
epoch-1 event after the first epoch-2 event.
"""

from __future__ import annotations

import os

import pytest

from subagents.store import Store, inspect, read_lease, read_mailbox, session_status
from subagents.supervisor import Capabilities, Provider, Supervisor, SupervisorConfig

from ._driver import DriverError, S, poll

pytestmark = pytest.mark.anyio

TTL = 0.5


def snapshot(st: Store, *session_ids: str) -> dict[str, bytes]:
    """Every file of these sessions (each one's file and its companions), byte for byte."""
    files = {}
    for sid in session_ids:
        for name in sorted(os.listdir(st.sessions_dir)):
            if name == sid or name.startswith(sid + "."):
                with open(os.path.join(st.sessions_dir, name), "rb") as handle:
                    files[name] = handle.read()
    return files


@pytest.mark.parametrize("whole_group", [True, False], ids=["host-paused", "supervisor-paused"])
async def test_a_paused_supervisor_is_fenced_after_takeover(tmp_path, hosts, whole_group) -> None:
    """SIGSTOP past the TTL, takeover at epoch 2, SIGCONT: FencedError in the old worker, the activation
    dropped without a write, one log line for the session, epochs never going back in the log."""
    st = Store(tmp_path / "store", durability="none")
    paused = hosts.start(st.root, lease_ttl_s=TTL)
    root = await paused.acall("open_root", label="paused")
    old_gate, new_gate = tmp_path / "old-gate", tmp_path / "new-gate"
    child, _ = await paused.acall(
        "start_continuable", parent=root, prompt=S({"say": "before"}, {"gate": str(old_gate)}, {"say": "after"}, {"return": "late"}),
        label="victim", provider="gated",
    )
    await poll(lambda: any(e["type"] == "assistant/message" for e in inspect(st, child).events), what="the first turn to run")

    paused.stop_outside_locks(st.session_path(child), st.session_path(root), group=whole_group)
    await poll(lambda: session_status(st, child) == "complete", timeout=TTL * 20, what="the paused owner to read dead")

    config = SupervisorConfig(pool_size=1, durability="none", lease_ttl_s=5.0)
    async with Supervisor.open(store=st.root, config=config) as sup:
        sup.register_provider(Provider(name="gated", program="tests.multi._driver:gated", capabilities=Capabilities.all(), continuable=True))
        taken = await sup.open_root(id=root)
        await sup.followup(taken, child, S({"gate": str(new_gate)}, {"say": "resumed"}, {"return": "resumed"}))
        await poll(lambda: any(e["type"] == "turn/start" and e["epoch"] == 2 for e in inspect(st, child).events),
                   what="the resumed turn to start at epoch 2")
        assert read_lease(st, child).epoch == 2

        # the paused host's turn may go on: at once if only its supervisor is stopped (its worker
        # meets the fence while nobody reads its pipe), else after SIGCONT; a fenced append writes
        # nothing, so the snapshot holds in either order
        old_gate.touch()
        before = snapshot(st, child, root)
        paused.cont(group=whole_group)

        def dropped() -> bool:
            return child not in paused.call("activations") and f"activation {child}" in paused.stderr_tail(100_000)

        await poll(dropped, what="the paused host to drop the fenced activation")
        assert snapshot(st, child, root) == before, "the fenced host wrote to the store"
        log = paused.stderr_tail(100_000)
        mentions = [line for line in log.splitlines() if child in line]
        assert len(mentions) == 1 and ("fenced" in mentions[0] or "taken over" in mentions[0]), log

        new_gate.touch()

        def notices() -> list:
            return [m for m in read_mailbox(st, root) if m.source.get("kind") == "subagent-settled" and m.source.get("sender_session_id") == child]

        await poll(notices, what="the resumed child to settle")
        assert read_lease(st, child).state == "released"
        events = inspect(st, child).events
        epochs = [e["epoch"] for e in events]
        first_new = epochs.index(2)
        assert all(epoch == 2 for epoch in epochs[first_new:]), epochs  # nothing of epoch 1 after epoch 2 began
        assert epochs == sorted(epochs)
        texts = [e["data"]["text"] for e in events if e["type"] == "assistant/message"]
        assert texts == ["before", "resumed"], texts  # the fenced "after" never landed
        ends = [(e["epoch"], e["data"]["stop_reason"]) for e in events if e["type"] == "turn/end"]
        assert ends == [(2, "interrupted"), (2, "completed")], ends  # the repair closed the old turn, at the new epoch
        settled = notices()
        assert len(settled) == 1 and settled[0].content.endswith("resumed"), [m.content for m in settled]  # only the new host's
        await sup.drain([taken])


async def test_a_supervisor_whose_root_was_taken_over_starts_no_more_work_under_it(tmp_path, hosts) -> None:
    """Found by a probe: after a pause past its TTL and a takeover of its root, the old host still took
    ``start_continuable`` and ``followup`` under that root (which need the exact live parent here); the new children's
    notices went to the root's new holder, and the old host's own take was FENCED, so its program never saw them.
    Both are FENCED now, before anything is made; a one-shot ``start``, which takes any parent the store holds, is
    unchanged."""
    st = Store(tmp_path / "store", durability="none")
    paused = hosts.start(st.root, lease_ttl_s=TTL)
    root = await paused.acall("open_root", label="paused")
    child, _ = await paused.acall("start_continuable", parent=root, prompt=S({"return": "first"}), label="idle")
    await poll(lambda: [m for m in read_mailbox(st, root) if m.source.get("kind") == "subagent-settled"],
               what="the child's first turn to settle")
    paused.stop_outside_locks(st.session_path(child), st.session_path(root))
    await poll(lambda: session_status(st, root) == "complete", timeout=TTL * 20, what="the paused owner to read dead")
    config = SupervisorConfig(pool_size=1, durability="none", lease_ttl_s=5.0)
    async with Supervisor.open(store=st.root, config=config) as sup:
        await sup.open_root(id=root)
        paused.cont()
        children_before = [row.id for row in await sup.list_children(root)]
        for op, kwargs in (
            ("start_continuable", {"parent": root, "prompt": S({"return": "late"}), "label": "late"}),
            ("followup", {"parent": root, "child": child, "prompt": S({"return": "late"})}),
            ("take_messages", {"root": root}),
        ):
            with pytest.raises(DriverError) as refused:
                await paused.acall(op, **kwargs)
            assert refused.value.code == "FENCED", (op, refused.value)
        assert [row.id for row in await sup.list_children(root)] == children_before
        assert [e["epoch"] for e in inspect(st, child).events if e["type"] == "turn/start"] == [1]
        ran = await paused.acall("start", parent=root, prompt="one-shot")
        assert ran["output"] == "one-shot", ran
