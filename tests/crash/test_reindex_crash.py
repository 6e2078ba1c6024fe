"""kill -9 of a host between a child's durable session file and its index entry: reindex does not resurrect it.

A real host (``tests/multi/_driver.py``) starts a one-shot child while the test
holds the parent's children index lock: the host's creator writes the child's
session file, makes it durable, names it, then blocks on that lock in the
kernel, before the append that lists the child and lets ``start`` return.
``/proc/locks`` shows the host waiting there; the test kills it with SIGKILL.
The caller never got the child's id and the child never ran: no listing shows
it, ``check`` counts it, ``fsck`` names it ``unacknowledged``, and ``store
reindex`` leaves it out (``--keep-unacknowledged`` lists it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from subagents import store
from subagents.store.fsck import fsck
from subagents.store.index_file import IndexFile
from tests.multi._driver import REPO_ROOT, HostFactory, wait_gone
from tests.store._support import blocked_on, wait_until


def _cli(st: store.Store, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", st.root, *args], capture_output=True, text=True,
                          env=env, timeout=60, check=True)


def test_a_child_whose_host_died_before_its_index_entry_stays_unlisted(tmp_path) -> None:
    st = store.Store(tmp_path / "store")
    hosts = HostFactory(tmp_path)
    try:
        host = hosts.start(st.root, durability="batched")
        root = host.call("open_root", label="parent")
        first = host.call("start", parent=root, prompt="hello")["child"]  # acknowledged, ran
        index = st.children_index_path(root)
        lock = IndexFile(index, owner=root, key=f"index/children/{root}")
        lock.acquire()
        try:
            host.send("start", parent=root, prompt="never acknowledged", wait=False)
            pending = wait_until(lambda: [s for s in st.session_ids() if s not in (root, first)], what="the child's session file")
            wait_until(lambda: blocked_on(host.pid, index), what="the host to wait for the index lock")
            host.kill()
        finally:
            lock.close()
        wait_gone(host.tag, timeout=10.0)
    finally:
        assert hosts.cleanup() == [], "processes of the host outlived it"
    [child] = pending
    assert store.read_header(st, child).parent_session == root
    assert [row.id for row in store.list_children(st, root)] == [first]

    report = store.check_store(st, in_flight_s=0.0)  # young, but its creator is dead: not in flight
    assert report.clean and report.counts.creations_interrupted == 1, str(report)
    findings = fsck(st, repair=False, lease_ttl_s=30.0)["findings"]
    assert [(f["id"], f["kind"]) for f in findings] == [(child, "unacknowledged")]

    done = json.loads(_cli(st, "store", "reindex", "--json").stdout)
    assert done["parents"] == {root: [first]} and done["left_out"] == {root: [child]}
    assert [row.id for row in store.list_children(st, root)] == [first]
    text = _cli(st, "store", "reindex").stdout
    assert f"{child}: child of {root}, left out" in text and "--keep-unacknowledged" in text

    done = json.loads(_cli(st, "store", "reindex", "--keep-unacknowledged", "--json").stdout)
    assert done["kept_unacknowledged"] == {root: [child]} and done["left_out"] == {}
    assert [row.id for row in store.list_children(st, root)] == [first, child]
