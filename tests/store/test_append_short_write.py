"""An append the file system takes only part of fails, and leaves the file as it was.

A mailbox acceptance, a children index entry and every other framed append
(``store/appender.py``) is one write. When the disk fills up, or the file
reaches the process's size limit, that write stores only its first bytes:
the kernel returns a short count, and the next write would fail. An append
that took the short count for success acknowledged a message it had not
stored (found with a full disk: ``followup`` returned, then the child's
turn failed on a mailbox whose last record was cut). The short writes here
are the kernel's own: a process whose file size limit (``RLIMIT_FSIZE``)
falls inside the record.

A log's writer goes on after such a failure (the log is whole again, cut
back): the turn can still close, with the error, instead of leaving an open
turn that lists as a crash. Any other failed write, or a failed fsync,
still breaks it (``test_log.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from subagents import store
from subagents.store import Store
from subagents.store.mailbox_read import scan_mailbox

from ..conftest import REPO_ROOT

LIMITED = """
import json, os, resource, signal, sys
from subagents import store
from subagents.store import Store
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit is short, or EFBIG, not a kill
st = Store(sys.argv[1], create=False, durability="batched")
what, path = sys.argv[2], sys.argv[3]
ids = store.IdGenerator()
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 100, hard))
try:
    if what == "mailbox":
        store.accept(st, "s1", source={"kind": "user"}, content="y" * 200_000, ids=ids)
    else:
        store.create_session(st, "cNew", parent_session="p", origin="subagent", delegation_depth=1,
                             events=[("subagent/descriptor", {"version": 1, "mode": "one-shot", "provider": "script",
                                                             "label": "z" * 300})])
    print(json.dumps({"ok": True}))
except store.SubagentError as exc:
    print(json.dumps({"code": exc.code, "message": exc.message}))
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
if what == "mailbox":
    store.accept(st, "s1", source={"kind": "user"}, content="after", ids=ids)
"""


def limited(st: Store, what: str, path: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", LIMITED, st.root, what, path], cwd=REPO_ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_message_cut_short_by_the_file_system_is_refused_and_leaves_the_mailbox_whole(tmp_path) -> None:
    st = Store(tmp_path / "store", durability="batched")
    store.create_session(st, "s1")
    store.accept(st, "s1", source={"kind": "user"}, content="before", ids=store.IdGenerator())
    mailbox = st.path("s1", "mailbox")
    assert limited(st, "mailbox", mailbox)["code"] == "DURABILITY_FAILED"
    assert [m.content for m in store.read_mailbox(st, "s1")] == ["before", "after"]
    assert scan_mailbox(st, "s1").result.damage is None  # the cut record is gone, not left as damage
    report = store.check_store(st)
    assert report.clean, str(report)


def test_an_index_entry_cut_short_fails_its_creation_and_leaves_the_index_whole(tmp_path) -> None:
    st = Store(tmp_path / "store", durability="batched")
    store.create_session(st, "p")
    for i in range(300):  # an index larger than a session's file, so only the index meets the limit
        store.create_session(st, f"c{i}", parent_session="p")
    index = st.children_index_path("p")
    assert os.path.getsize(index) > os.path.getsize(st.session_path("c0")) + 4096
    got = limited(st, "index", index)
    assert got["code"] == "DURABILITY_FAILED" and "children" in got["message"], got
    assert not st.exists("cNew")  # rolled back: its creation failed
    read = store.read_index(st, "p")
    assert read.problems == [] and [e.id for e in read.entries] == [f"c{i}" for i in range(300)]
    store.create_session(st, "cLater", parent_session="p")
    assert [e.id for e in store.read_children(st, "p")][-1] == "cLater"
    assert store.check_store(st).clean


LOG_LIMITED = """
import json, os, resource, signal, sys
from subagents import store
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
st = store.Store(sys.argv[1], create=False, durability="batched")
with store.LogWriter.open(st, "s1", epoch=0) as writer:
    writer.append([("turn/start", {})])
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(st.session_path("s1")) + 100, hard))
    try:
        writer.append([("assistant/message", {"text": "y" * 200_000})])
        print(json.dumps({"ok": True}))
    except store.SubagentError as exc:
        print(json.dumps({"code": exc.code, "message": exc.message}))
    writer.append([("turn/end", {"stop_reason": "error", "diagnostic": "DURABILITY_FAILED"})], commit=True)
"""


def test_a_log_append_cut_short_is_refused_and_the_writer_closes_the_turn(tmp_path) -> None:
    st = Store(tmp_path / "store", durability="batched")
    store.create_session(st, "s1")
    done = subprocess.run([sys.executable, "-c", LOG_LIMITED, st.root], cwd=REPO_ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["code"] == "DURABILITY_FAILED" and "short write" in got["message"], got
    found = store.inspect(st, "s1")
    assert found.status == "clean" and [e["type"] for e in found.events] == ["turn/start", "turn/end"]
