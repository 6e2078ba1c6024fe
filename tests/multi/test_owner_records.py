"""Records of dead owners in ``owners/``: removed once they hold nothing, never a live owner's.

Issue 5: every supervisor killed with ``kill -9`` left its ``owners/<id>``
forever (10 killed hosts, 10 files). A record is removed when its process is
gone for good (on this host: its pid runs no more, or runs another process)
and no unreleased lease names it, by the next supervisor to open or close on
the store, or by gc. A dead owner that still holds a lease keeps its record
(``store check`` tells a crashed holder from one that closed without
releasing by that record), and a live owner, or a stopped one whose process
still runs, keeps its record whatever its heartbeat's age.
"""

from __future__ import annotations

import os

import anyio
import pytest

from subagents.store import Store, owner_alive, read_lease, read_owner
from subagents.store.check import check_store
from subagents.store.retention import collect
from subagents.supervisor import Supervisor, SupervisorConfig

from ._driver import poll, wait_gone

pytestmark = pytest.mark.anyio

CONFIG = SupervisorConfig(pool_size=1, durability="none", start_method="fork", lease_ttl_s=30.0)


def owner_files(st: Store) -> set[str]:
    """The owner records (not their ``.held`` hints: ``store/reaper.py``)."""
    return {name for name in os.listdir(st.owners_dir) if "." not in name}


def kill_all(hosts_: list) -> None:
    """kill -9, the last started first: a host removes dead records when it opens (one that opened
    seconds earlier is done with that), so none of them sees another one dead."""
    for host in reversed(hosts_):
        host.kill()
    for host in hosts_:
        wait_gone(host.tag, timeout=10.0)


async def test_records_of_killed_hosts_are_removed_by_the_next_supervisor(tmp_path, hosts) -> None:
    """Three hosts killed with kill -9 leave three records; the next supervisor to open removes them."""
    st = Store(tmp_path / "store", durability="none")
    doomed = [hosts.start(st.root, name=f"doomed{i}", lease_ttl_s=30.0) for i in range(3)]
    killed = {host.owner for host in doomed}
    await anyio.to_thread.run_sync(kill_all, doomed)
    assert owner_files(st) == killed
    async with Supervisor.open(st.root, CONFIG) as sup:
        ours = sup.lease_keeper.owner_id
        await poll(lambda: owner_files(st) == {ours}, what="the killed hosts' records removed")
    assert owner_files(st) == set()
    assert check_store(st).clean


async def test_a_dead_owner_holding_a_lease_keeps_its_record_until_it_is_taken_over(tmp_path, hosts) -> None:
    """The record of a killed host that holds a root stays (check stays clean) until a supervisor takes the root."""
    st = Store(tmp_path / "store", durability="none")
    doomed = hosts.start(st.root, name="holder", lease_ttl_s=30.0)
    root = await doomed.acall("open_root", label="kept")
    await anyio.to_thread.run_sync(kill_all, [doomed])
    async with Supervisor.open(st.root, CONFIG) as sup:
        ours = sup.lease_keeper.owner_id
        with anyio.fail_after(20):
            await sup.lease_keeper.reap()  # as at open: nothing to remove while the root names it
        assert owner_files(st) == {doomed.owner, ours}
        assert check_store(st).clean
        await sup.open_root(id=root)
        assert read_lease(st, root).owner == ours
    # at close the root is released, and the killed host holds nothing any more
    assert owner_files(st) == set()
    assert check_store(st).clean


async def test_gc_removes_the_record_of_a_killed_host_that_holds_nothing(tmp_path, hosts) -> None:
    """``store gc`` removes such records too (no supervisor needs to open) and counts them."""
    st = Store(tmp_path / "store", durability="none")
    doomed = hosts.start(st.root, name="doomed", lease_ttl_s=30.0)
    await anyio.to_thread.run_sync(kill_all, [doomed])
    assert collect(st, 3600.0, dry_run=True).owners_removed == 1
    assert owner_files(st) == {doomed.owner}
    report = collect(st, 3600.0)
    assert report.owners_removed == 1
    assert owner_files(st) == set()


async def test_live_and_stopped_owners_keep_their_records_while_others_are_removed(tmp_path, hosts) -> None:
    """A live host and a SIGSTOPped one (heartbeat past its TTL, process still running) keep their records,
    while two supervisors opening at once remove the killed host's."""
    st = Store(tmp_path / "store", durability="none")
    live = hosts.start(st.root, name="live", lease_ttl_s=30.0)
    stopped = hosts.start(st.root, name="stopped", lease_ttl_s=0.5)
    doomed = hosts.start(st.root, name="doomed", lease_ttl_s=30.0)
    stopped.stop()
    await anyio.to_thread.run_sync(kill_all, [doomed])
    # its heartbeat ages past its TTL: it reads dead, though its process still runs
    await poll(lambda: not owner_alive(read_owner(st, stopped.owner)), what="the stopped host read dead by age")
    assert owner_files(st) == {live.owner, stopped.owner, doomed.owner}
    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(_open_and_wait_for, st, doomed.owner, {live.owner, stopped.owner})
    assert owner_files(st) == {live.owner, stopped.owner}
    stopped.cont()
    assert (await live.acall("info"))["owner"] == live.owner
    assert live.close() == 0 and stopped.close() == 0
    assert owner_files(st) == set()


async def _open_and_wait_for(st: Store, removed: str, kept: set[str]) -> None:
    async with Supervisor.open(st.root, CONFIG):
        await poll(lambda: removed not in owner_files(st), what="the killed host's record removed")
        assert kept <= owner_files(st)


async def test_a_later_pass_rereads_only_the_leases_that_named_a_dead_holder(tmp_path, hosts) -> None:
    """A pass that finds a dead owner still holding leases remembers which; the supervisor's later passes (the one
    at close among them) read those leases again, not every session's in the store."""
    st = Store(tmp_path / "store", durability="none")
    doomed = hosts.start(st.root, name="holder", lease_ttl_s=30.0)
    root = await doomed.acall("open_root", label="kept")
    await anyio.to_thread.run_sync(kill_all, [doomed])
    async with Supervisor.open(st.root, CONFIG) as sup:
        keeper = sup.lease_keeper
        await poll(lambda: keeper.statistics().leases_read >= 1, what="the pass at open")
        assert keeper.statistics().leases_read == 1  # the store's one session
        for i in range(20):
            await sup.open_root(label=f"other-{i}")
        with anyio.fail_after(20):
            assert await keeper.reap() == []
        assert keeper.statistics().leases_read == 2  # the kept root's lease again, none of the 20 others
        assert owner_files(st) == {doomed.owner, keeper.owner_id}
        await sup.open_root(id=root)
        assert read_lease(st, root).owner == keeper.owner_id
    # at close: the kept root released, its lease read once more, and the record removed
    assert keeper.statistics().leases_read == 3
    assert owner_files(st) == set()
    assert check_store(st).clean


async def test_a_new_supervisor_rereads_only_the_leases_an_earlier_one_found_naming_a_dead_holder(tmp_path, hosts) -> None:
    """What a pass found is left beside the dead owner's record (``<id>.held``): the next supervisor, a new
    process, reads those leases, not every session's; once the holder holds nothing, record and hint go."""
    st = Store(tmp_path / "store", durability="none")
    doomed = hosts.start(st.root, name="holder", lease_ttl_s=30.0)
    root = await doomed.acall("open_root", label="kept")
    await anyio.to_thread.run_sync(kill_all, [doomed])
    async with Supervisor.open(st.root, CONFIG) as first:
        await poll(lambda: first.lease_keeper.statistics().leases_read >= 1, what="the pass at open")
        for i in range(20):
            await first.open_root(label=f"other-{i}")
    assert os.path.exists(st.owner_path(doomed.owner) + ".held")
    async with Supervisor.open(st.root, CONFIG) as second:
        keeper = second.lease_keeper
        await poll(lambda: keeper.statistics().leases_read >= 1, what="the pass at open")
        assert keeper.statistics().leases_read == 1  # the kept root's lease, not the 21 sessions'
        await second.open_root(id=root)
    assert sorted(os.listdir(st.owners_dir)) == []  # the record and its hint
    assert check_store(st).clean
