"""The lease keeper of a Supervisor in another process, read from the store by this one.

One owner record per supervisor, its heartbeat renewed every TTL/3 (the
lease files themselves are never rewritten by a renewal); every open root
and every live activation holds a lease at an epoch, whose state follows
the activation (``running`` while a turn runs or waits to run, ``idle``
while the child only waits on its own children) and is released when the
activation settles. Turns are held open with gate files (``_driver.gated``),
never with sleeps.
"""

from __future__ import annotations

import os
import time

import pytest

from subagents.store import LeaseHeldError, Store, acquire_lease, owner_alive, read_lease, read_owner, session_status
from subagents.supervisor import SupervisorConfig

from ..session_bytes import SLOT_SIZE, SLOTS_AT, file_bytes
from ._driver import S


def poll(predicate, *, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def lease_state(st: Store, session_id: str) -> str | None:
    lease = read_lease(st, session_id)
    return None if lease is None else lease.state


def test_default_ttl_is_five_seconds() -> None:
    """The configured default: TTL 5 s (renewed every TTL/3 by the keeper)."""
    assert SupervisorConfig().lease_ttl_s == 5.0


def test_one_heartbeat_renewed_every_third_of_the_ttl_covers_every_lease(tmp_path, hosts) -> None:
    """A host with a root and 5 live children has ONE owner file, renewed every ~TTL/3, never lapsing;
    renewals leave every lease file untouched; settling releases each child's lease."""
    ttl = 0.6
    st = Store(tmp_path / "store", durability="none")
    host = hosts.start(st.root, lease_ttl_s=ttl)
    root = host.call("open_root", label="keeper")
    gate = tmp_path / "gate"
    children = [
        host.call("start_continuable", parent=root, prompt=S({"gate": str(gate)}, {"return": f"c{i}"}), label=f"c{i}", provider="gated")[0]
        for i in range(5)
    ]
    assert os.listdir(st.owners_dir) == [host.owner]
    sessions = [root, *children]
    leases = {sid: read_lease(st, sid) for sid in sessions}
    assert all(lease is not None and lease.owner == host.owner for lease in leases.values())
    slots = {sid: file_bytes(st, sid)[SLOTS_AT : SLOTS_AT + 2 * SLOT_SIZE] for sid in sessions}

    beats: list[float] = []
    first = read_owner(st, host.owner)
    assert first is not None and first.ttl == ttl and first.pid == host.pid

    def renewed_four_times() -> bool:
        record = read_owner(st, host.owner)
        assert owner_alive(record), "the owner lapsed between two renewals"
        assert record is not None
        if not beats or record.heartbeat_at != beats[-1]:
            beats.append(record.heartbeat_at)
        return len(beats) >= 5

    poll(renewed_four_times, timeout=20, what="four heartbeats")
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    assert min(gaps) >= ttl / 3 * 0.9, gaps  # never faster than TTL/3 ...
    assert max(gaps) < ttl, gaps  # ... and never so late that the owner would read dead
    assert os.listdir(st.owners_dir) == [host.owner]  # still one file: renewal cost is independent of the leases
    for sid in sessions:
        now = file_bytes(st, sid)[SLOTS_AT : SLOTS_AT + 2 * SLOT_SIZE]
        assert now == slots[sid], f"lease of {sid} was rewritten"
        assert session_status(st, sid) in ("running", "idle")

    gate.touch()
    poll(lambda: all(lease_state(st, c) == "released" for c in children), what="every child released")
    assert [lease_state(st, c) for c in children] == ["released"] * 5
    assert all(read_lease(st, c).epoch == 1 for c in children)  # released, the epoch stays
    assert lease_state(st, root) == "idle"  # the open root keeps its lease

    assert host.close() == 0
    assert lease_state(st, root) == "released"
    assert os.listdir(st.owners_dir) == []


def test_lease_state_follows_the_activation_across_processes(tmp_path, hosts) -> None:
    """running while its turn runs → idle while it only waits on its own child → released when settled;
    the open root holds its lease (idle) and cannot be taken while the host lives."""
    st = Store(tmp_path / "store", durability="none")
    host = hosts.start(st.root, lease_ttl_s=1.0)
    root = host.call("open_root", label="states")
    lease = read_lease(st, root)
    assert (lease.owner, lease.epoch, lease.state) == (host.owner, 1, "idle")
    with pytest.raises(LeaseHeldError):
        acquire_lease(st, root, "someone-else")

    g1, g2, g3 = (tmp_path / f"g{i}" for i in (1, 2, 3))
    grandchild_turn = S({"gate": str(g2)}, {"return": "grandchild done"})
    parent_turn = S({"gate": str(g1)}, {"start_continuable": {"prompt": grandchild_turn, "label": "grandchild"}}, {"return": "parent done"})
    child, _ = host.call("start_continuable", parent=root, prompt=parent_turn, label="parent", provider="gated")

    poll(lambda: any(e["type"] == "turn/start" for e in _events(st, child)), what="the child's turn to start")
    assert (read_lease(st, child).owner, read_lease(st, child).epoch, lease_state(st, child)) == (host.owner, 1, "running")
    assert session_status(st, child) == "running"

    g1.touch()  # the child starts its own child and ends its turn: it now only waits
    poll(lambda: lease_state(st, child) == "idle", what="the child to go idle")
    (grandchild,) = [row["id"] for row in host.call("list_children", parent=child)]
    assert lease_state(st, grandchild) == "running"
    assert read_lease(st, grandchild).owner == host.owner
    assert session_status(st, child) == "idle" and session_status(st, grandchild) == "running"

    g2.touch()  # the grandchild settles; its notice wakes the child for one turn; then the child settles
    poll(lambda: lease_state(st, grandchild) == "released" and lease_state(st, child) == "released", what="both to settle")
    assert session_status(st, child) == "complete" and session_status(st, grandchild) == "complete"

    run = host.call("start", parent=root, prompt=S({"gate": str(g3)}, {"return": "one-shot done"}), provider="gated", wait=False)
    one_shot = run["child"]
    assert (read_lease(st, one_shot).epoch, lease_state(st, one_shot)) == (1, "running")
    g3.touch()
    poll(lambda: lease_state(st, one_shot) == "released", what="the one-shot child to release")
    host.call("dispose", child=one_shot)
    assert lease_state(st, root) == "idle"


def _events(st: Store, session_id: str):
    from subagents.store import inspect

    return inspect(st, session_id).events
