"""Stress: N supervisor processes × M children, random kill -9s and restarts, invariants from the logs.

Each host process runs the ``chaos`` workload of ``_driver.py``: several
concurrent lanes that start continuable children under its roots, follow
them up (cold-resuming children a dead host left behind), and run one-shot
children (some turns spawn a one-shot grandchild). The test kills a random
host with SIGKILL after a random number of accepted messages and starts a
replacement that takes over the dead host's roots (``open_root(id=...)``)
and children. Right after each kill (once the process is reaped) every
session the dead host held must read ``complete``; lease epochs sampled
over the run never go down.

At the end every host is gone (killed or closed) and no process of any host
remains; a Supervisor here takes over every root and sends each continuable
child one last message, which delivers whatever was still pending. Then,
from the logs and mailboxes alone:

* epochs never decrease along a log (each epoch is one contiguous run);
* one writer per epoch: turns never interleave — every turn's events carry
  its ``turn/start``'s epoch, except the crash closers a later epoch's
  repair appended (``turn/end`` ``interrupted``);
* no event carries an epoch above its session's lease epoch;
* every message a host reported accepted is consumed exactly once, in
  exactly one transcript (its child's), and each child consumes its mailbox
  exactly once in FIFO order;
* a one-shot child has its one message and at most one turn;
* every child reads ``complete``.

The default run is small (``SMALL``); ``@pytest.mark.stress`` runs ``LARGE``.
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict

import anyio
import pytest

from subagents.store import Store, check_store, inspect, list_children, list_descendants, read_header, read_lease, read_mailbox, session_status
from subagents.supervisor import Capabilities, Provider, Supervisor, SupervisorConfig

from ._driver import Driver, HostFactory, S, wait_gone

SMALL = {"hosts": 3, "kills": 6, "steps": 15, "lanes": 2, "max_children": 3, "seeds": [5, 17]}
LARGE = {"hosts": 6, "kills": 40, "steps": 60, "lanes": 3, "max_children": 8, "seeds": [101, 202, 303]}
CONSUMING = ("message/accepted", "message/discarded")


class World:
    """What the hosts reported, and the checks made while they run."""

    def __init__(self, st: Store, hosts: HostFactory, size: dict, rng: random.Random) -> None:
        self.st = st
        self.hosts = hosts
        self.size = size
        self.rng = rng
        self.roots_of: dict[str, list[str]] = {}  # host tag -> roots it holds
        self.epochs: dict[str, int] = {}  # session -> highest lease epoch seen
        self.kill_checks = 0

    def start(self, roots: list[str], new_roots: int) -> Driver:
        host = self.hosts.start(self.st.root, durability="none", lease_ttl_s=5.0)
        children = [[root, e.id] for root in roots for e in list_children(self.st, root) if getattr(e, "mode", None) == "continuable"]
        host.call(
            "chaos", roots=roots, children=children, new_roots=new_roots, max_children=self.size["max_children"],
            steps=self.size["steps"], lanes=self.size["lanes"], seed=self.rng.randrange(1 << 30),
        )
        self.roots_of[host.tag] = list(roots)
        return host

    def roots(self, host: Driver) -> list[str]:
        """Roots the host held: those it was handed and those it reported opening."""
        held = list(self.roots_of[host.tag])
        held += [e["root"] for e in host.events("root") if e["root"] not in held]
        # a root it opened but was killed before reporting is found from the store at the end
        return held

    def check_after_kill(self, dead: Driver) -> None:
        """Every session the dead host held reads complete at once; lease epochs never went down."""
        for sid in self.st.session_ids():
            lease = read_lease(self.st, sid)
            if lease is None:
                continue
            assert lease.epoch >= self.epochs.get(sid, 0), f"the lease epoch of {sid} went down"
            self.epochs[sid] = lease.epoch
            if lease.owner == dead.owner:
                assert session_status(self.st, sid) == "complete", f"{sid} still held by the dead host {dead.name}"
        self.kill_checks += 1


def wait_accepted(host: Driver, count: int, *, timeout: float = 30.0) -> None:
    """Until the host reported ``count`` accepted messages or finished its workload (or died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and host.alive:
        if len(host.events("accepted")) >= count or host.events("chaos-done"):
            return
        time.sleep(0.005)


def run_chaos(st: Store, hosts: HostFactory, size: dict, seed: int) -> tuple[dict[str, list[str]], list[Driver]]:
    rng = random.Random(seed)
    world = World(st, hosts, size, rng)
    live = [world.start([], new_roots=1) for _ in range(size["hosts"])]
    everyone = list(live)
    for _ in range(size["kills"]):
        victim = rng.choice(live)
        wait_accepted(victim, rng.randint(1, 6))
        time.sleep(rng.choice([0.0, 0.0, rng.uniform(0.0, 0.05)]))  # chaos, not synchronisation: lands the kill mid-work
        victim.kill()
        world.check_after_kill(victim)
        report = check_store(st)  # while the other hosts write
        assert report.clean, str(report)
        live.remove(victim)
        replacement = world.start(world.roots(victim), new_roots=rng.choice([0, 1]))
        live.append(replacement)
        everyone.append(replacement)
    for host in live:
        host.wait_event(lambda e: e["event"] == "chaos-done", timeout=120)
    for host in live:
        if rng.random() < 0.5:
            host.kill()
            world.check_after_kill(host)
        else:
            assert host.close() == 0, host.stderr_tail()
    for host in everyone:
        wait_gone(host.tag, timeout=10.0)  # no orphan worker or forkserver of any host
    accepted: dict[str, list[str]] = defaultdict(list)
    for host in everyone:
        for event in host.events("accepted"):
            accepted[event["child"]].append(event["message"])
    return accepted, everyone


async def deliver_everything(st: Store) -> None:
    """Take over every root and send each continuable child a last message; wait until all settled."""
    roots = [sid for sid in st.session_ids() if read_header(st, sid).parent_session is None]
    config = SupervisorConfig(pool_size=2, durability="none")
    async with Supervisor.open(store=st.root, config=config) as sup:
        caps = Capabilities.all()
        sup.register_provider(Provider(name="script", program="script", capabilities=caps, continuable=True))
        sup.register_provider(Provider(name="echo", program="echo", capabilities=caps, continuable=True))
        finals: dict[str, str] = {}
        for root_id in roots:
            root = await sup.open_root(id=root_id)
            for entry in await sup.list_children(root_id):
                if getattr(entry, "mode", None) == "continuable":
                    finals[entry.id] = await sup.followup(root, entry.id, S({"return": "final"}))

        def delivered(child: str) -> bool:
            events = inspect(st, child).events
            taken = [i for i, e in enumerate(events) if e["type"] == "message/accepted" and e["data"]["message_id"] == finals[child]]
            return bool(taken) and any(e["type"] == "turn/end" for e in events[taken[0]:])

        with anyio.fail_after(120):
            while not all(delivered(c) for c in finals):
                await anyio.sleep(0.02)
            while sup.continuation.activations:
                await anyio.sleep(0.02)


def check_logs(st: Store, accepted: dict[str, list[str]]) -> dict[str, int]:
    """The invariants, from logs and mailboxes alone. Returns counts for the failure context."""
    transcripts: dict[str, list[str]] = defaultdict(list)  # message id -> sessions consuming it
    counts = Counter()
    for sid in st.session_ids():
        header = read_header(st, sid)
        events = inspect(st, sid).events
        epochs = [e["epoch"] for e in events]
        assert epochs == sorted(epochs), f"{sid}: an epoch went back: {epochs}"
        lease = read_lease(st, sid)
        assert max(epochs, default=0) <= (lease.epoch if lease else 0), f"{sid}: an event above the lease epoch"
        open_epoch = None
        for e in events:
            if e["type"] == "turn/start":
                assert open_epoch is None, f"{sid}: turns interleave at seq {e['seq']}"
                open_epoch = e["epoch"]
            elif open_epoch is not None:
                repair = e["epoch"] > open_epoch and e["type"] in ("turn/end", "step/end", "tool/result")
                if not repair:
                    assert e["epoch"] == open_epoch, f"{sid}: seq {e['seq']} written at epoch {e['epoch']} inside a turn of epoch {open_epoch}"
                if e["type"] == "turn/end":
                    assert not repair or e["data"]["stop_reason"] == "interrupted", f"{sid}: seq {e['seq']}"
                    open_epoch = None
        for e in events:
            if e["type"] in CONSUMING:
                transcripts[e["data"]["message_id"]].append(sid)
        if header.parent_session is None:
            counts["roots"] += 1
            continue
        descriptor = next((e["data"] for e in events if e["type"] == "subagent/descriptor"), None)
        if descriptor is not None and descriptor.get("mode") == "one-shot":
            counts["one-shot"] += 1
            assert [e["type"] for e in events].count("message/accepted") == 1, sid
            assert [e["type"] for e in events].count("turn/start") <= 1, sid
            assert set(epochs) <= {0, 1}, sid
            continue
        counts["continuable"] += 1
        consumed = [e["data"]["message_id"] for e in events if e["type"] in CONSUMING]
        mailbox = [m.id for m in read_mailbox(st, sid)]
        assert consumed == mailbox, f"{sid}: the mailbox was not consumed exactly once in FIFO order"
        printed = accepted.get(sid, [])
        assert set(printed) <= set(consumed), f"{sid}: accepted messages missing from its transcript"
        counts["accepted"] += len(printed)
        counts["epochs>1"] += max(epochs) > 1
        counts["repaired turns"] += sum(1 for e in events if e["type"] == "turn/end" and e["data"]["stop_reason"] == "interrupted")
    for child, ids in accepted.items():
        for mid in ids:
            assert transcripts[mid] == [child], f"message {mid} of {child} consumed in {transcripts[mid]}"
    for sid, sessions in transcripts.items():
        assert len(sessions) == 1, f"message {sid} consumed more than once: {sessions}"
    for root in [s for s in st.session_ids() if read_header(st, s).parent_session is None]:
        statuses = {row.entry.status for row in list_descendants(st, root) if row.entry.kind == "child"}
        assert statuses <= {"complete"}, f"below {root}: {statuses}"
    return dict(counts)


async def stress(tmp_path, hosts: HostFactory, size: dict, seed: int) -> dict[str, int]:
    st = Store(tmp_path / "store", durability="none")
    accepted, everyone = await anyio.to_thread.run_sync(run_chaos, st, hosts, size, seed)
    await deliver_everything(st)
    counts = check_logs(st, accepted)
    report = check_store(st)
    assert report.clean, str(report)
    refused = Counter(e["code"] for host in everyone for e in host.events("refused"))
    assert set(refused) <= {"NOT_RESUMABLE"}, refused
    assert counts.get("accepted", 0) > 0 and counts.get("continuable", 0) > 0, counts
    return counts


@pytest.mark.anyio
@pytest.mark.parametrize("seed", SMALL["seeds"])
async def test_kill_restart_chaos_small(tmp_path, hosts, seed) -> None:
    """SMALL: a few hosts, a few kills; every invariant holds from the logs alone."""
    await stress(tmp_path, hosts, SMALL, seed)


@pytest.mark.stress
@pytest.mark.anyio
@pytest.mark.parametrize("seed", LARGE["seeds"])
async def test_kill_restart_chaos_large(tmp_path, hosts, seed) -> None:
    """LARGE: more hosts, children and kills (minutes)."""
    await stress(tmp_path, hosts, LARGE, seed)


def test_checker_catches_a_stale_writer(tmp_path) -> None:
    """The epoch checks are not vacuous: an epoch-1 append after an epoch-2 one is reported."""
    from subagents.store import LogWriter, acquire_lease, create_session

    st = Store(tmp_path / "store", durability="none")
    create_session(st, "01ROOT")
    lease = acquire_lease(st, "01ROOT", "owner-a")
    with LogWriter.open(st, "01ROOT", epoch=lease.epoch) as writer:
        writer.append([("turn/start", {"message_id": "m1"})])
    forged = inspect(st, "01ROOT").events
    # what two writers without fencing would leave: rewrite the log with an epoch going back
    from subagents.store import encode_record
    from tests.session_bytes import write_log

    records = [*forged, {"seq": len(forged), "ts": 0.0, "type": "turn/end", "data": {"stop_reason": "completed", "diagnostic": None}, "epoch": 0}]
    write_log(st, "01ROOT", b"".join(encode_record(r) for r in records))
    with pytest.raises(AssertionError, match="epoch went back"):
        check_logs(st, {})
