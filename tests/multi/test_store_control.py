"""Control through the store from another process: host-user ``send`` and ``interrupt``.

A Supervisor in a subprocess hosts a continuable child whose first turn
sleeps; the test process (another Supervisor on the same store, which never
opened that root) sends it messages and interrupts it. Each request is
acknowledged once durable, and is carried out by the hosting supervisor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from contextlib import asynccontextmanager
from typing import AsyncIterator

import anyio
import pytest

from subagents.store import inspect, read_controls, read_lease, read_mailbox
from subagents.supervisor import Capabilities, Provider, Supervisor, SupervisorConfig, UserAuthority

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HOST = textwrap.dedent(
    """
    import json, sys, anyio
    from subagents.supervisor import *

    async def main(store):
        cfg = SupervisorConfig(pool_size=1, durability="none", control_poll_s=0.02)
        async with Supervisor.open(store=store, config=cfg) as sup:
            sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
            root = await sup.open_root(label="host")
            first = json.dumps({"script": [{"sleep": 60000}]})
            child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=first, label="sleeper"))
            print(json.dumps({"root": root.id, "child": child}), flush=True)
            await anyio.sleep(3600)

    anyio.run(main, sys.argv[1])
    """
)


def _events(store, child_id):
    return inspect(store, child_id).events


async def _until(predicate, timeout_s: float = 20.0):
    with anyio.fail_after(timeout_s):
        while not predicate():
            await anyio.sleep(0.02)


@asynccontextmanager
async def _beside(store_path: str, child: str) -> AsyncIterator[Supervisor]:
    """A second supervisor on the host's store, once the host's child runs its first turn."""
    cfg = SupervisorConfig(pool_size=1, durability="none")
    async with Supervisor.open(store=store_path, config=cfg) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        await _until(lambda: any(e["type"] == "turn/start" for e in _events(sup.store, child)))
        yield sup


@pytest.fixture
def host(tmp_path):
    store_path = str(tmp_path / "st")
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.Popen([sys.executable, "-c", HOST, store_path], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        line = proc.stdout.readline()
        assert line, "the host supervisor did not start"
        yield store_path, json.loads(line), proc
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.anyio
async def test_send_and_interrupt_reach_the_supervisor_hosting_the_child(host) -> None:
    """A send from another process runs as the next turn in the host; an interrupt stops the sleeping turn."""
    store_path, ids, proc = host
    root, child = ids["root"], ids["child"]
    async with _beside(store_path, child) as sup:
        host_owner = read_lease(sup.store, child).owner

        message_id = await sup.send(child, json.dumps({"script": [{"return": "from afar"}]}), parent=root)
        assert message_id in [m.id for m in read_mailbox(sup.store, child)]  # durable before the ack
        asked = await sup.interrupt(child, authority=UserAuthority(parent_session=root))  # no wait: delivered, not confirmed
        assert (asked.outcome, asked.host, asked.turn, asked.detail) == ("requested", host_owner, 1, "not waited for")
        assert [r.kind for r in read_controls(sup.store, child)] == ["interrupt"]

        def ran() -> bool:
            ends = [e["data"]["stop_reason"] for e in _events(sup.store, child) if e["type"] == "turn/end"]
            return ends == ["aborted", "completed"]

        await _until(ran)
        events = _events(sup.store, child)
        assert [e["data"]["message_id"] for e in events if e["type"] == "message/accepted"][-1] == message_id
        assert {e["epoch"] for e in events if e["type"] == "turn/start"} == {1}  # both turns ran in the host
        assert read_lease(sup.store, child).owner == host_owner
        assert sup.continuation.activations == {}  # this supervisor hosted nothing


@pytest.mark.anyio
async def test_send_cold_resumes_here_when_nobody_hosts_the_child(host) -> None:
    """After the host dies, a send from another process resumes the child at a higher epoch."""
    store_path, ids, proc = host
    root, child = ids["root"], ids["child"]
    cfg = SupervisorConfig(pool_size=1, durability="none")
    async with Supervisor.open(store=store_path, config=cfg) as sup:
        await _until(lambda: any(e["type"] == "turn/start" for e in _events(sup.store, child)))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        await sup.send(child, json.dumps({"script": [{"return": "resumed"}]}), parent=root)
        await _until(
            lambda: any(e["type"] == "turn/end" and e["data"]["stop_reason"] == "completed" for e in _events(sup.store, child))
        )
        ends = [(e["epoch"], e["data"]["stop_reason"]) for e in _events(sup.store, child) if e["type"] == "turn/end"]
        assert ends == [(2, "interrupted"), (2, "completed")]  # crash repair runs at the new epoch
        # the settlement notice went to the root's durable mailbox: the root was never opened here
        await _until(lambda: any("resumed" in str(m.content) for m in read_mailbox(sup.store, root)))


@pytest.mark.anyio
async def test_send_checks_the_durable_parent(host) -> None:
    """A send naming the wrong root is UNAUTHORIZED and writes nothing."""
    from subagents.store.errors import SubagentError

    store_path, ids, _proc = host
    cfg = SupervisorConfig(pool_size=1, durability="none")
    async with Supervisor.open(store=store_path, config=cfg) as sup:
        before = read_mailbox(sup.store, ids["child"])
        with pytest.raises(SubagentError) as caught:
            await sup.send(ids["child"], "x", parent="01WRONGROOT")
        assert caught.value.code == "UNAUTHORIZED"
        assert read_mailbox(sup.store, ids["child"]) == before


@pytest.mark.anyio
async def test_drain_remote_tears_down_a_child_hosted_elsewhere(host) -> None:
    """drain_remote writes a durable drain request; the hosting supervisor disposes the child."""
    store_path, ids, _proc = host
    root, child = ids["root"], ids["child"]
    cfg = SupervisorConfig(pool_size=1, durability="none")
    async with Supervisor.open(store=store_path, config=cfg) as sup:
        await _until(lambda: any(e["type"] == "turn/start" for e in _events(sup.store, child)))
        assert await sup.drain_remote(root) == [child]
        await _until(lambda: read_lease(sup.store, child).state == "released")
        ends = [e["data"]["stop_reason"] for e in _events(sup.store, child) if e["type"] == "turn/end"]
        assert ends == ["aborted"]
        assert (await sup.list_children(root))[0].status == "complete"


def _consumed(store, child_id, message_id):
    return [e["type"] for e in _events(store, child_id)
            if e["type"] in ("message/accepted", "message/discarded") and (e["data"] or {}).get("message_id") == message_id]


@pytest.mark.anyio
async def test_a_drain_its_host_never_carried_out_is_carried_out_by_the_next_one(host) -> None:
    """drain_remote named the child (asked its live host), then that host died before it read the
    request (stopped, then killed: a SIGTERM, a crash, or a Ctrl-C whose close was already under way,
    which skips a drain): the message queued before the drain is discarded by the supervisor that
    takes the child next, not run there as if the drain had never been asked."""
    store_path, ids, proc = host
    root, child = ids["root"], ids["child"]
    async with _beside(store_path, child) as sup:
        queued = await sup.send(child, json.dumps({"script": [{"return": "queued before the drain"}]}), parent=root)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            assert await sup.drain_remote(root) == [child]
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            os.kill(proc.pid, signal.SIGCONT)
            proc.wait(10)
        after = await sup.send(child, json.dumps({"script": [{"return": "sent after the drain"}]}), parent=root)
        await _until(lambda: _consumed(sup.store, child, after) == ["message/accepted"])
        assert _consumed(sup.store, child, queued) == ["message/discarded"]


@pytest.mark.anyio
async def test_send_interrupt_and_drain_behind_a_stopped_lock_holder_end_without_writing(host, monkeypatch) -> None:
    """A stopped process holding the child's file lock (SIGSTOP inside a critical section): ``send`` and
    ``interrupt`` from another host end at their caller's deadline, ``drain_remote`` names the child it
    could not reach after the lock timeout (shortened here), and nothing of theirs is written. Once the
    holder is gone, the child takes a send again."""
    from subagents.store import SubagentError
    from ..supervisor.test_lock_wait import stopped_holder

    monkeypatch.setattr("subagents.supervisor.continuable.teardown.LOCK_TIMEOUT_S", 0.5)
    store_path, ids, _proc = host
    root, child = ids["root"], ids["child"]
    async with _beside(store_path, child) as sup:
        with stopped_holder(sup.store.session_path(child)):
            for call in (lambda: sup.send(child, json.dumps({"script": [{"return": "never"}]}), parent=root),
                         lambda: sup.interrupt(child, authority=UserAuthority(parent_session=root))):
                began = anyio.current_time()
                with pytest.raises(TimeoutError):
                    with anyio.fail_after(1.0):
                        await call()
                assert anyio.current_time() - began < 3.0
            began = anyio.current_time()
            with pytest.raises(SubagentError) as caught:
                await sup.drain_remote(root)
            assert anyio.current_time() - began < 5.0
            assert "LOCK_TIMEOUT" in caught.value.fields["failed"][child], caught.value
        assert read_controls(sup.store, child) == []
        assert not [m for m in read_mailbox(sup.store, child) if "never" in m.content]
        message_id = await sup.send(child, json.dumps({"script": [{"return": "after"}]}), parent=root)
        assert message_id in [m.id for m in read_mailbox(sup.store, child)]
