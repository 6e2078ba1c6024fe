"""A settled child damaged in place, through the real CLI: ``ls`` and ``show`` give its diagnostic.

Audit: such a child listed as ``complete`` with its outcome (its ``settled``
row was taken after an ``lstat`` of type and length), and ``show`` of a child
whose committed log record was overwritten printed the normal view — a
``crashed`` outcome, an open turn — from the records before the damage, and
exited 0. Now ``ls`` lists it ``corrupt`` and ``show`` prints
``error: CORRUPT_SESSION: ...`` with where and why, and exits 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from subagents import store
from subagents.store.framing import FRAME, encode_record
from subagents.store.outcome import CRASHED_ONE_SHOT_TEXT

from ..session_bytes import HEADER_AT, append_log, log_data, log_start, patch
from .test_cli import _env, _Lines, cli

TURN = [("turn/start", {}), ("assistant/message", {"text": "done"}), ("turn/end", {"stop_reason": "completed"})]


def settled_children(path: Path, mode: str = "one-shot") -> store.Store:
    """Root ``r`` with children ``a`` and ``b`` (of ``mode``), each run at epoch 1 and released (its ``settled`` row written)."""
    st = store.Store(path)
    store.create_session(st, "r")
    owner = store.new_id()
    store.register_owner(st, owner, ttl=60.0)
    for child in ("a", "b"):
        store.create_session(st, child, parent_session="r", origin="subagent", delegation_depth=1, lease_owner=owner,
                             events=[("subagent/descriptor", {"version": 1, "mode": mode, "provider": "p", "label": child})])
        with store.LogWriter.open(st, child, epoch=1) as writer:
            writer.append(TURN, commit=True)
        store.release_lease(st, child, owner, 1)
    return st


def flip(st: store.Store, session_id: str, offset: int) -> None:
    with open(st.session_path(session_id), "rb") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
    patch(st, session_id, offset, bytes([byte ^ 0xFF]))


@pytest.mark.parametrize("where", ["header", "log record"])
def test_show_and_ls_of_a_child_damaged_in_place_give_its_diagnostic(tmp_path: Path, where: str) -> None:
    st = settled_children(tmp_path / "st")
    found = store.inspect(st, "b")
    assistant = next(i for i, e in enumerate(found.events) if e["type"] == "assistant/message")
    offset = HEADER_AT + 11 if where == "header" else log_start(st, "b") + found.offsets[assistant] + FRAME.size + 4
    flip(st, "b", offset)

    listed = cli("--store", "st", "ls", "r", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert (rows["b"]["kind"], rows["b"]["reason"]) == ("diagnostic", "corrupt"), rows
    assert (rows["a"]["kind"], rows["a"]["status"], rows["a"]["outcome"]) == ("child", "complete", "completed"), rows

    for extra in ((), ("--json",)):
        shown = cli("--store", "st", "show", "b", *extra, cwd=tmp_path)
        assert shown.returncode == 2 and shown.stdout == "", (shown.stdout, shown.stderr)
        reason = "header crc mismatch" if where == "header" else f"crc-mismatch at byte {found.offsets[assistant]}"
        assert shown.stderr.startswith('error: CORRUPT_SESSION: stored session "b" failed validation: '), shown.stderr
        assert reason in shown.stderr, shown.stderr
    sibling = cli("--store", "st", "show", "a", "--json", cwd=tmp_path)
    assert sibling.returncode == 0 and json.loads(sibling.stdout)["outcome"] == "completed", sibling.stderr


FOLLOW_DEADLINE_S = 30.0  # a follow that waits past this on a log that can show nothing more hung


def follow(cwd: Path, session_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``log ID --follow``, bounded: a follow still waiting at the deadline fails the test with what it printed."""
    try:
        return subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "log", session_id, "--follow", *extra],
                              cwd=cwd, env=_env(), capture_output=True, text=True, timeout=FOLLOW_DEADLINE_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"log --follow of a corrupt log waited; stdout={exc.stdout!r} stderr={exc.stderr!r}")


@pytest.mark.parametrize("mode", ["one-shot", "continuable"])
def test_log_follow_of_a_corrupt_log_prints_the_damage_and_ends(tmp_path: Path, mode: str) -> None:
    """Found by a probe: `log --follow` of a finished child whose committed log record was damaged printed
    the records before the damage, then waited forever in silence (a one-shot child's turn/end lay past
    the damage, where no reader goes). Nothing past committed damage ever reads, so following it now prints
    what plain `log` prints (the records, then the corrupt-log line) and ends with plain `log`'s status, 0."""
    st = settled_children(tmp_path / "st", mode)
    found = store.inspect(st, "b")
    assistant = next(i for i, e in enumerate(found.events) if e["type"] == "assistant/message")
    flip(st, "b", log_start(st, "b") + found.offsets[assistant] + FRAME.size + 4)

    plain = cli("--store", "st", "log", "b", cwd=tmp_path)
    assert plain.returncode == 0 and f"(corrupt log: crc-mismatch at byte {found.offsets[assistant]}," in plain.stdout, plain.stdout
    followed = follow(tmp_path, "b")
    assert (followed.returncode, followed.stdout, followed.stderr) == (0, plain.stdout, "")

    doc = json.loads(cli("--store", "st", "log", "b", "--json", cwd=tmp_path).stdout)
    followed = follow(tmp_path, "b", "--json")
    assert followed.returncode == 0, followed.stderr
    lines = [json.loads(line) for line in followed.stdout.splitlines()]
    assert lines[:-1] == doc["events"] and len(lines) == assistant + 1
    assert lines[-1] == {"session": "b", "log_status": "corrupt", "damage": doc["damage"]}


def test_log_follow_ends_at_damage_written_while_it_follows(tmp_path: Path) -> None:
    """The same when the damage lands after the follow began: a running one-shot child's records, the
    second one damaged, then its turn/end (a committed record past the damage, so no write in flight)."""
    st = store.Store(tmp_path / "st", durability="none")
    owner = store.new_id()
    store.register_owner(st, owner, ttl=60.0)  # this process: the turn's host, alive while it follows
    store.create_session(st, "c", lease_owner=owner, events=[("subagent/descriptor", {"version": 1, "mode": "one-shot", "provider": "p"}),
                                                             ("turn/start", {})])
    proc = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "log", "c", "--follow"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = _Lines(proc)
        assert "subagent/descriptor" in lines.next() and "turn/start" in lines.next()
        start = len(log_data(st, "c"))
        records = [encode_record({"seq": seq, "ts": time.time(), "type": kind, "data": data, "epoch": 0})
                   for seq, kind, data in ((2, "assistant/message", {"text": "done"}), (3, "turn/end", {"stop_reason": "completed"}))]
        damaged = bytearray(records[0])
        damaged[FRAME.size + 4] ^= 0xFF
        append_log(st, "c", bytes(damaged) + records[1])
        # counted to the last non-zero byte (the zero padding is no data, nor is a record's own last 0 told from it)
        after = len((bytes(damaged) + records[1]).rstrip(b"\0"))
        assert lines.next().strip() == f"(corrupt log: crc-mismatch at byte {start}, {after} bytes after the valid prefix)"
        assert proc.wait(timeout=FOLLOW_DEADLINE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("json_mode", [False, True], ids=["text", "json"])
def test_log_follow_of_a_one_shot_child_whose_host_died_ends_with_the_crash(tmp_path: Path, json_mode: bool) -> None:
    """Found by a probe: `log --follow` of a one-shot child whose host was killed mid-turn waited in silence
    for good, while `ls` called it crashed (a one-shot child is never resumed: its log grows no more). It
    follows while the host lives, and ends with the crash once the host is gone, exiting 0 as at damage."""
    st = store.Store(tmp_path / "st", durability="none")
    owner = store.new_id()
    script = "import sys, time; from subagents import store; store.register_owner(store.Store(sys.argv[1]), sys.argv[2], ttl=60.0); print('up', flush=True); time.sleep(600)"
    host = subprocess.Popen([sys.executable, "-c", script, st.root, owner], env=_env(), stdout=subprocess.PIPE, text=True)
    proc = None
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == "up"
        store.create_session(st, "r")
        store.create_session(st, "c", parent_session="r", origin="subagent", delegation_depth=1, lease_owner=owner, events=[
            ("subagent/descriptor", {"version": 1, "mode": "one-shot", "provider": "p"}), ("turn/start", {}),
            ("assistant/message", {"text": "starting"}),
        ])
        extra = ["--json"] if json_mode else []
        proc = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "log", "c", "--follow", *extra],
                                cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = _Lines(proc)
        assert [lines.next() for _ in range(3)][-1].count("starting") == 1
        time.sleep(1.0)  # several polls: a live host may still end the turn, so the follow goes on
        assert proc.poll() is None
        host.kill()
        host.wait()
        last = lines.next().strip()
        if json_mode:
            assert json.loads(last) == {"session": "c", "outcome": "crashed", "error": CRASHED_ONE_SHOT_TEXT}
        else:
            assert last == f"(crashed: {CRASHED_ONE_SHOT_TEXT})"
        assert proc.wait(timeout=FOLLOW_DEADLINE_S) == 0
    finally:
        for running in (host, proc):
            if running is not None and running.poll() is None:
                running.kill()
                running.wait()


def test_drain_of_a_settled_child_whose_mailbox_is_a_folder_names_it_without_a_traceback(tmp_path: Path) -> None:
    """Found by a probe: a settled continuable child (its row read from the index, its mailbox not) whose
    mailbox was replaced by a folder made drain print two tracebacks, then "nothing to drain", exit 0."""
    st = settled_children(tmp_path / "st", "continuable")
    os.mkdir(st.path("b", "mailbox"))
    done = cli("--store", "st", "drain", "r", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    assert done.stdout.splitlines()[0].startswith("could not drain b: SESSION_UNAVAILABLE: "), done.stdout


def test_drain_passes_over_a_damaged_child_its_index_records_as_one_shot(tmp_path: Path) -> None:
    """A drain tears down continuable descendants only: a damaged child whose index entry says it is
    one-shot is none of its business, and does not make it exit 1 (one of unknown mode does, above)."""
    st = settled_children(tmp_path / "st", "one-shot")
    assert {e.id: e.mode for e in store.read_children(st, "r")} == {"a": "one-shot", "b": "one-shot"}
    flip(st, "b", HEADER_AT + 11)
    listed = json.loads(cli("--store", "st", "ls", "r", "--json", cwd=tmp_path).stdout)
    assert [row.get("kind") for row in listed] == ["child", "diagnostic"], listed
    done = cli("--store", "st", "drain", "r", cwd=tmp_path)
    assert done.returncode == 0 and "could not drain" not in done.stdout, (done.stdout, done.stderr)
