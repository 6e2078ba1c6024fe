"""A power loss right after a supervisor acknowledged something: what it acknowledged is on the disk.

The store lives on an ext4 without a journal in a loop-attached file (``tests/crash/_power_loss.py``).
The supervisor runs in another process (``tests/multi/_driver.py``: ``Supervisor.open`` with real
worker processes, ``durability="batched"``), so that its death is a real one: the device is copied
while it is still open, right after the call returned — nothing it does later may help — and only
then is it killed, its pid gone as after a reboot. The copy is checked with the boot's ``e2fsck -p``
and read read-only with the store's readers; a second copy of it, attached read-write, is the disk a
restarted host finds, and a ``Supervisor`` opened on it (in this process) lists, resumes and follows
up what the first one left.

What they found: nothing acknowledged was missing. Releases, lease states and ``settled`` rows are
not durable, by design; their loss (the usual case here: the tests take the copy within a second,
long before writeback) leaves leases of a dead owner, which read as ``complete``. The mailbox,
control and children-index files are made by an ``O_CREAT`` whose only fsync is the file's own:
their names survive because ext4 without a journal also writes the folder entry of a file created
since its last fsync (``ext4_sync_parent``); a journaling file system commits it with the file.

Not tested here: an interrupt ``cancelled`` on another host's confirmation is answered once the
holder's log shows the turn's end, which it reads before the holder's fsync of that end returns (a
window of one fsync, not reproducible here). An interrupt of a turn held here writes nothing
before it answers (the turn's end follows at its own commit), and a ``drain`` or ``interrupt``
control record the holder had not applied before the loss is ignored by the next activation
(older requests are about older turns), as after any crash of the holder.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import anyio
import pytest

from subagents import store
from subagents.store.control import read_controls
from subagents.supervisor import Capabilities, Provider, Supervisor, SupervisorConfig

from ..crash._power_loss import LoopFs, after_power_loss, journal_less_disk, run, seen
from ..multi._driver import Driver, HostFactory, S

pytestmark = pytest.mark.anyio

HOST = {"pool_size": 2, "durability": "batched"}


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[LoopFs]:
    """An ext4 without a journal in a loop-attached file (the ``disk`` of ``tests/crash/conftest.py``)."""
    with journal_less_disk(tmp_path) as fs:
        yield fs


@pytest.fixture
def hosts(tmp_path: Path, disk: LoopFs) -> Iterator[HostFactory]:
    """Supervisors in other processes; torn down before ``disk``, which a live one keeps busy."""
    factory = HostFactory(tmp_path)
    yield factory
    assert factory.cleanup() == [], "processes of a host outlived it"


@contextlib.contextmanager
def power_loss(disk: LoopFs, *hosts: Driver) -> Iterator[tuple[Path, Path]]:
    """The device as it is now, while ``hosts`` still run, mounted read-only twice: as it is (a boot
    without a check) and after the boot's ``e2fsck -p``. The hosts are killed once the copy is
    taken (their pids are gone, as after a reboot)."""
    with after_power_loss(disk, "lost.img") as as_is:
        for host in hosts:
            host.kill()
        with after_power_loss(disk, "checked.img", "-p", source=disk.image.with_name("lost.img")) as checked:
            yield as_is, checked


def written_back(disk: LoopFs, what: str, files: dict[str, list[str]] | None = None) -> None:
    """What the kernel had written back before the power loss on its own schedule, besides what the
    store fsync'd: nothing (``none``), everything (``all``), or the files ``files[what]`` names, as if
    writeback had picked those."""
    if what == "all":
        run("sync", "-f", str(disk.mount))
        return
    for path in (files or {}).get(what, []):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def rebooted(disk: LoopFs) -> contextlib.AbstractContextManager[Path]:
    """A writable copy of the last ``power_loss`` image after its ``e2fsck -p``: the disk a
    restarted host mounts."""
    return after_power_loss(disk, "rebooted.img", writable=True, source=disk.image.with_name("checked.img"))


@contextlib.asynccontextmanager
async def restarted(mount: Path) -> AsyncIterator[Supervisor]:
    """A supervisor of the restarted host, on the rebooted disk, with the providers the first one had."""
    caps = Capabilities.all()
    async with Supervisor.open(store=mount / "store", config=SupervisorConfig(pool_size=1, durability="batched")) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=caps, continuable=True))
        sup.register_provider(Provider(name="echo", program="echo", capabilities=caps, continuable=True))
        yield sup


def until(predicate: Any, what: str, timeout: float = 20.0) -> Any:
    """Poll ``predicate`` (the live store, from this process) until it holds; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)
    return value


def notices(st: store.Store, root: str, child: str) -> list[store.MailboxMessage]:
    """``child``'s settlement notices in ``root``'s mailbox, taken or not."""
    return [m for m in store.read_mailbox(st, root)
            if m.source.get("kind") == "subagent-settled" and m.source.get("sender_session_id") == child]


def accepted(events: list[dict[str, Any]]) -> list[str]:
    """The messages a log consumed into turns, in order."""
    return [e["data"]["message_id"] for e in events if e["type"] == "message/accepted"]


def said(st: store.Store, session_id: str, text: str) -> bool:
    """Whether the session's log (as the page cache holds it) has an assistant message ``text``: the
    turn got that far, past the actions before it."""
    return any(e["type"] == "assistant/message" and e["data"].get("text") == text for e in store.inspect(st, session_id).events)


async def closing(sup: Supervisor, root: Any, child: str, output: str) -> store.MailboxMessage:
    """Take ``root``'s messages until ``child``'s settlement notice with closing message ``output``."""
    with anyio.fail_after(20):
        while True:
            for message in await sup.wait_for_message(root, timeout_s=20):
                if message.source.get("sender_session_id") == child and message.content.endswith(f"Its closing message:\n{output}"):
                    return message


def rows(entries: list[Any]) -> dict[str, tuple[str, str, str | None]]:
    """Each listed child's kind, status and outcome (a diagnostic row: its kind twice)."""
    return {e.id: (e.kind, getattr(e, "status", e.kind), getattr(e, "outcome", None)) for e in entries}


# -- 1. one-shot children whose result returned ------------------------------------------------


@pytest.mark.parametrize("writeback", ["none", "index", "children", "all"])
async def test_one_shot_children_whose_result_returned_list_as_before_after_a_power_loss(disk, hosts, tmp_path, writeback):
    """Each child whose ``result()`` returned has its ``turn/end`` on the disk, and its row after the
    loss is the row it had before — from its ``settled`` row in the parent's index or from its
    files: its release and that row are not durable, and a lost release reads as its dead owner's
    lease. The children: completed ones (one with a log long enough for an identity cache, 64 KiB,
    which its commit wrote in place, unsynced, before later creations fsynced ``sessions/``), a
    failed turn, a worker that died mid-turn (the supervisor fenced and repaired the log), one with a
    child of its own, and one stopped by its holder (``dispose`` of a running turn: ``aborted``). A
    child still running at the loss lists complete, never ``running``. ``writeback``: what the kernel
    had written back before the loss besides what was fsync'd — the parent's index (the ``settled``
    rows, not the releases), the children's files (the releases, not the rows), or everything."""
    host = hosts.start(disk.mount / "store", **HOST)
    live = seen(disk.mount)
    root = host.call("open_root", label="main")
    grandchild = {"spawn": {"prompt": S({"return": "grand"}), "provider": "script", "label": "g"}}
    prompts = [S({"say": "x" * 70_000}, {"return": "long"}), S(grandchild, {"return": "parent"}), S({"fail": "boom"}),
               S({"say": "dying"}, {"exit": 3}), S({"return": "last"})]
    done = [host.call("start", parent=root, prompt=prompt, label=f"o{i}", provider="script") for i, prompt in enumerate(prompts)]
    assert [d["stop_reason"] for d in done] == ["completed", "completed", "error", "error", "completed"]
    children = [d["child"] for d in done]
    assert (disk.mount / "store" / "sessions" / f"{children[0]}.identity").exists()
    gate = str(tmp_path / "gate")
    stopped = host.call("start", parent=root, prompt=S({"say": "held"}, {"hold": gate}), provider="script", wait=False)["child"]
    until(lambda: said(live, stopped, "held"), "a turn to stop running")
    host.call("dispose", child=stopped)  # cancelled: its result() returned ``aborted``
    children.append(stopped)
    running = host.call("start", parent=root, prompt=S({"say": "held"}, {"hold": gate}), provider="script", wait=False)["child"]
    until(lambda: said(live, running, "held"), "the last child's turn running")
    before = store.list_descendants(live, root)
    assert [(r.entry.id, r.entry.status, r.entry.outcome) for r in before if r.depth == 1] == [
        *zip(children, ["complete"] * 6, ["completed", "completed", "error", "interrupted", "completed", "aborted"]),
        (running, "running", None),
    ]
    assert [(r.parent_id, r.entry.status) for r in before if r.depth == 2] == [(children[1], "complete")]
    settled = before[:-1]
    written_back(disk, writeback, {"index": [live.children_index_path(root)], "children": [live.session_path(c) for c in children]})

    with power_loss(disk, host) as mounts:
        for found in map(seen, mounts):
            for child in children:
                assert store.inspect(found, child, locked=True).events[-1]["type"] == "turn/end", child
            assert [(r.id, r.status) for r in store.list_roots(found)] == [(root, "complete")]
            assert [e.id for e in store.read_children(found, root)] == [*children, running]
            *after, last = store.list_descendants(found, root)
            assert after == settled
            assert (last.entry.id, last.entry.status) == (running, "complete")

    with rebooted(disk) as mount:
        async with restarted(mount) as sup:
            again = await sup.open_root(id=root)
            *after, last = await sup.list_descendants(again.id)
            assert after == settled
            assert (last.entry.id, last.entry.status) == (running, "complete")


# -- 2. messages accepted ----------------------------------------------------------------------


@pytest.mark.parametrize("writeback", ["none", "all"])
async def test_messages_a_supervisor_accepted_before_a_power_loss_run_exactly_once_after_it(disk, hosts, tmp_path, writeback):
    """``start_continuable`` and ``followup`` returned: each message is in the child's mailbox after
    the loss, and a restarted supervisor runs each once, in order — the one whose turn committed
    before the loss not again, the one whose turn was running and the one queued behind it once.
    A ``report`` the running turn made (it returned: the turn said so after it) is in the root's
    mailbox too. With everything written back (``all``) the running turn's records are on the disk:
    its message was taken, and its turn ends ``interrupted`` by the repair instead of running again."""
    host = hosts.start(disk.mount / "store", **HOST)
    live = seen(disk.mount)
    root = host.call("open_root", label="main")
    child, first = host.call("start_continuable", parent=root, prompt=S({"return": "one"}), label="worker")
    until(lambda: notices(live, root, child), "the first turn's settlement")
    gate = tmp_path / "gate"
    second = host.call("followup", parent=root, child=child,
                       prompt=S({"report": "progress", "delivery": "wakeup"}, {"say": "reported"}, {"hold": str(gate)}, {"return": "two"}))
    until(lambda: said(live, child, "reported"), "the report of the second turn")
    third = host.call("followup", parent=root, child=child, prompt=S({"return": "three"}))
    fresh, started = host.call("start_continuable", parent=root, prompt=S({"hold": str(gate)}, {"return": "fresh"}), label="fresh")
    written_back(disk, writeback)

    with power_loss(disk, host) as mounts:
        for found in map(seen, mounts):
            assert [m.id for m in store.read_mailbox(found, child, locked=True)] == [first, second, third]
            assert [m.id for m in store.read_mailbox(found, fresh, locked=True)] == [started]
            assert [e.id for e in store.read_children(found, root)] == [child, fresh]
            reports = [m for m in store.read_mailbox(found, root, locked=True) if m.source.get("kind") == "subagent-report"]
            assert [m.content.endswith(" reported:\nprogress") for m in reports] == [True]
            assert accepted(store.inspect(found, child, locked=True).events)[0] == first

    gate.touch()
    with rebooted(disk) as mount:
        async with restarted(mount) as sup:
            again = await sup.open_root(id=root)
            fourth = await sup.followup(again, child, S({"return": "four"}))
            await closing(sup, again, child, "four")
            events = store.inspect(sup.store, child).events
            assert accepted(events) == [first, second, third, fourth]
            ends = [e["data"]["stop_reason"] for e in events if e["type"] == "turn/end"]
            assert ends == ["completed", "completed" if writeback == "none" else "interrupted", "completed", "completed"], ends
            again_fresh = await sup.followup(again, fresh, S({"return": "fresh again"}))
            await closing(sup, again, fresh, "fresh again")
            assert accepted(store.inspect(sup.store, fresh).events) == [started, again_fresh]


# -- 3. settlement notices and the releases before them ----------------------------------------


async def test_children_that_settled_before_a_power_loss_are_taken_over_and_followed_up_after_it(disk, hosts):
    """Two children settled; the root took the first one's notice before the loss (``take_messages``
    returned), not the second's. Each child's lease was released before its notice, not durably.
    After the loss the notices are both in the root's mailbox, the children list complete, and a
    restarted supervisor delivers the second notice once and the first never again, then takes the
    first child over at a higher epoch and follows it up, with no fencing of its own writes."""
    host = hosts.start(disk.mount / "store", **HOST)
    live = seen(disk.mount)
    root = host.call("open_root", label="main")
    child, first = host.call("start_continuable", parent=root, prompt=S({"say": "epoch one"}, {"return": "one"}), label="a")
    [taken] = until(lambda: notices(live, root, child), "the first settlement notice")
    assert [m["id"] for m in host.call("take_messages", root=root)] == [taken.id]
    other, _ = host.call("start_continuable", parent=root, prompt=S({"return": "other"}), label="b")
    [notice] = until(lambda: notices(live, root, other), "the second settlement notice")
    expected = {child: ("child", "complete", "completed"), other: ("child", "complete", "completed")}

    with power_loss(disk, host) as mounts:
        for found in map(seen, mounts):
            assert [m.id for m in store.read_mailbox(found, root, locked=True)] == [taken.id, notice.id]
            assert store.inspect(found, root, locked=True).events[-1]["data"]["message_id"] == taken.id
            old = store.inspect(found, child, locked=True).events
            assert old[-1]["type"] == "turn/end" and old[-1]["data"]["stop_reason"] == "completed"
            assert rows(store.list_children(found, root)) == expected
            old_epoch = max(store.read_lease(found, child).epoch, *(e["epoch"] for e in old))

    with rebooted(disk) as mount:
        async with restarted(mount) as sup:
            again = await sup.open_root(id=root)
            assert rows(await sup.list_children(root)) == expected
            assert [m.id for m in await sup.take_messages(again)] == [notice.id]
            second = await sup.followup(again, child, S({"return": "two"}))
            await closing(sup, again, child, "two")
            events = store.inspect(sup.store, child).events
            assert events[: len(old)] == old
            new = events[len(old):]
            assert accepted(events) == [first, second]
            assert min(e["epoch"] for e in new) > old_epoch
            assert [e["data"]["stop_reason"] for e in new if e["type"] == "turn/end"] == ["completed"]
            assert await sup.take_messages(again) == []
            assert rows(await sup.list_children(root)) == expected


# -- 4. interrupts -----------------------------------------------------------------------------


async def test_an_interrupt_requested_before_a_power_loss_is_on_the_disk_and_stops_no_later_turn(disk, hosts, tmp_path):
    """An interrupt of a turn another live supervisor runs is ``requested`` once its control record
    is durable: the record is on the disk after the loss (for a one-shot and a continuable child).
    A restarted supervisor lists both children complete, and the stale request stops no turn of the
    continuable child it resumes. (An interrupt of a turn held by the interrupting supervisor
    itself writes nothing: the turn's ``turn/end`` follows, at its own commit.)"""
    host = hosts.start(disk.mount / "store", **HOST)
    other = hosts.start(disk.mount / "store", name="other", **HOST)
    live = seen(disk.mount)
    root = host.call("open_root", label="main")
    gate = tmp_path / "gate"
    held = S({"say": "held"}, {"hold": str(gate)}, {"return": "done"})
    child, first = host.call("start_continuable", parent=root, prompt=held, label="worker")
    one_shot = host.call("start", parent=root, prompt=held, provider="script", wait=False)["child"]
    until(lambda: said(live, child, "held") and said(live, one_shot, "held"), "both turns running")
    answers = [other.call("interrupt", child=target, parent=root, wait_s=0) for target in (child, one_shot)]
    assert [a["outcome"] for a in answers] == ["requested", "requested"], answers

    with power_loss(disk, host, other) as mounts:
        for found in map(seen, mounts):
            for target in (child, one_shot):
                assert [r.kind for r in read_controls(found, target)] == ["interrupt"], target

    gate.touch()
    with rebooted(disk) as mount:
        async with restarted(mount) as sup:
            again = await sup.open_root(id=root)
            listed = rows(await sup.list_children(root))
            assert listed[one_shot][:2] == ("child", "complete") and listed[child][:2] == ("child", "complete"), listed
            second = await sup.followup(again, child, S({"sleep": 200}, {"return": "two"}))
            await closing(sup, again, child, "two")
            events = store.inspect(sup.store, child).events
            assert accepted(events)[-1] == second
            assert events[-1]["type"] == "turn/end" and events[-1]["data"]["stop_reason"] == "completed"


async def test_messages_a_drain_discarded_before_a_power_loss_never_run_after_it(disk, hosts, tmp_path):
    """``drain`` returned: the turn it stopped ended ``aborted`` and the messages queued behind it
    were logged ``message/discarded``, durably. After the loss a restarted supervisor runs only
    what is sent later, never the discarded messages."""
    host = hosts.start(disk.mount / "store", **HOST)
    live = seen(disk.mount)
    root = host.call("open_root", label="main")
    child, first = host.call("start_continuable", parent=root, prompt=S({"say": "held"}, {"hold": str(tmp_path / "gate")}),
                             label="worker")
    until(lambda: said(live, child, "held"), "the first turn running")
    queued = [host.call("followup", parent=root, child=child, prompt=S({"return": f"queued {i}"})) for i in range(2)]
    host.call("drain", root=root)

    with power_loss(disk, host) as mounts:
        for found in map(seen, mounts):
            events = store.inspect(found, child, locked=True).events
            assert [e["data"]["stop_reason"] for e in events if e["type"] == "turn/end"] == ["aborted"]
            assert [e["data"]["message_id"] for e in events if e["type"] == "message/discarded"] == queued
            assert [m.id for m in store.read_mailbox(found, child, locked=True)] == [first, *queued]

    with rebooted(disk) as mount:
        async with restarted(mount) as sup:
            again = await sup.open_root(id=root)
            later = await sup.followup(again, child, S({"return": "later"}))
            await closing(sup, again, child, "later")
            events = store.inspect(sup.store, child).events
            assert accepted(events) == [first, later]
            assert [e["data"]["stop_reason"] for e in events if e["type"] == "turn/end"] == ["aborted", "completed"]
