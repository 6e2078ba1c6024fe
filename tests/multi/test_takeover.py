"""Takeover of a dead supervisor's roots and children by another supervisor.

* ``kill -9`` of a host (same host, TTL 30 s so that only the pid check can
  tell): its root and every child read ``complete`` at the first look after
  the process is gone, its workers (and its forkserver) leave the process
  table, and a Supervisor here re-opens its root by id and follows up each
  of its children: a cold resume at epoch 2, after the repair of the turn
  the kill cut short.
* a host paused with SIGSTOP (its pid still runs: the "other host" case)
  reads ``complete`` once its heartbeat is older than its TTL — within TTL +
  one renewal period — and ``running`` again when it resumes, if nobody took
  its children meanwhile.
"""

from __future__ import annotations

import time

import anyio
import pytest

from subagents.store import Store, inspect, list_descendants, read_lease, session_status
from subagents.supervisor import Capabilities, Provider, Supervisor, SupervisorConfig

from ._driver import S, poll, tagged_pids, wait_gone

pytestmark = pytest.mark.anyio

CHILDREN = 6


def epochs_never_go_back(events: list[dict]) -> bool:
    epochs = [e["epoch"] for e in events]
    return epochs == sorted(epochs)


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
async def test_a_killed_supervisor_is_complete_at_once_and_taken_over(tmp_path, hosts, start_method) -> None:
    """kill -9: complete at the first look, no process of it remains, its root and children resume elsewhere."""
    st = Store(tmp_path / "store", durability="none")
    host = hosts.start(st.root, pool_size=2, lease_ttl_s=30.0, start_method=start_method)
    root = await host.acall("open_root", label="doomed")
    gate = tmp_path / "gate"
    children = []
    for i in range(CHILDREN):
        child, _ = await host.acall("start_continuable", parent=root, prompt=S({"gate": str(gate)}, {"return": f"first {i}"}), label=f"c{i}", provider="gated")
        children.append(child)
    one_shot = (await host.acall("start", parent=root, prompt=S({"gate": str(gate)}), provider="gated", wait=False))["child"]
    await poll(lambda: sum(any(e["type"] == "turn/start" for e in inspect(st, s).events) for s in [*children, one_shot]) >= 2,
               what="two turns running in the two workers")
    processes = tagged_pids(host.tag)
    assert host.pid in processes and len(processes) >= 3, processes  # the host and its two workers (+ forkserver)
    assert {row.entry.status for row in list_descendants(st, root)} == {"running"}

    killed_at = host.kill()
    first_look = {row.entry.id: row.entry.status for row in list_descendants(st, root)}
    complete_ms = (time.monotonic() - killed_at) * 1000
    assert first_look == {cid: "complete" for cid in [*children, one_shot]}, f"{complete_ms:.0f} ms after the kill"
    assert session_status(st, root) == "complete"
    # the pid check, not the heartbeat: with a 30 s TTL, only a dead pid reads complete this early
    assert complete_ms < 30_000
    await anyio.to_thread.run_sync(lambda: wait_gone(host.tag, timeout=10.0))  # parent-death detection: no orphans

    gate.touch()  # the resumed first turns may pass
    config = SupervisorConfig(pool_size=2, durability="none", lease_ttl_s=30.0)
    async with Supervisor.open(store=st.root, config=config) as sup:
        sup.register_provider(Provider(name="gated", program="tests.multi._driver:gated", capabilities=Capabilities.all(), continuable=True))
        taken = await sup.open_root(id=root)
        assert read_lease(st, root).epoch == 2 and read_lease(st, root).owner == sup.lease_keeper.owner_id
        for i, child in enumerate(children):
            await sup.followup(taken, child, S({"return": f"resumed {i}"}))

        def resumed(child: str) -> bool:
            return any(e["type"] == "turn/end" and e["epoch"] == 2 and e["data"]["stop_reason"] == "completed"
                       and any(x["type"] == "assistant/message" and x["data"]["text"].startswith("resumed") for x in inspect(st, child).events)
                       for e in inspect(st, child).events)

        await poll(lambda: all(resumed(c) for c in children), what="every child resumed at epoch 2")
        for child in children:
            events = inspect(st, child).events
            assert epochs_never_go_back(events), child
            ends = [(e["epoch"], e["data"]["stop_reason"]) for e in events if e["type"] == "turn/end"]
            assert ends[-1] == (2, "completed"), ends
            # a turn the kill cut short was closed by the resume's repair, at the new epoch
            assert all(reason != "interrupted" or epoch == 2 for epoch, reason in ends), ends
            assert read_lease(st, child).epoch == 2
        await poll(lambda: all(read_lease(st, c).state == "released" for c in children), what="every resumed child to settle")
        await sup.drain([taken])


async def test_a_paused_supervisor_reads_complete_after_its_ttl(tmp_path, hosts) -> None:
    """SIGSTOP (pid alive, heartbeat stale): complete within TTL + TTL/3; running again after SIGCONT.

    The TTL leaves the test room on a loaded machine: "running right after the stop" holds while
    the last heartbeat (at most TTL/3 old at the stop) is younger than the TTL."""
    ttl = 2.0
    st = Store(tmp_path / "store", durability="none")
    host = hosts.start(st.root, lease_ttl_s=ttl)
    root = await host.acall("open_root", label="paused")
    gate = tmp_path / "gate"
    child, _ = await host.acall("start_continuable", parent=root, prompt=S({"gate": str(gate)}, {"return": "x"}), label="c", provider="gated")
    await poll(lambda: any(e["type"] == "turn/start" for e in inspect(st, child).events), what="the turn to run")

    host.stop()  # the host and its workers, as a paused machine
    stopped_at = time.monotonic()
    assert session_status(st, child) == "running"  # its heartbeat is at most TTL/3 old
    await poll(lambda: session_status(st, child) == "complete" and session_status(st, root) == "complete",
               timeout=ttl * 10, what="the paused owner to read dead")
    elapsed = time.monotonic() - stopped_at
    assert elapsed <= ttl + ttl / 3 + 1.0, f"complete only {elapsed:.2f}s after the stop (TTL {ttl}s; 1 s for the polling)"

    host.cont()  # nobody took it over: its next heartbeat makes it live again
    await poll(lambda: session_status(st, child) == "running", timeout=ttl * 10, what="the resumed owner to read live")
    gate.touch()
    await poll(lambda: session_status(st, child) == "complete" and read_lease(st, child).state == "released", what="the child to settle")
    assert {e["epoch"] for e in inspect(st, child).events} == {0, 1}  # never taken over: one epoch from creation on
