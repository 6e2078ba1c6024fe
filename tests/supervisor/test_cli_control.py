"""``send``, ``interrupt``, ``drain`` and ``top``: the CLI controlling children another process hosts.

A Supervisor in a subprocess (the *host*) opens a root and a continuable
child whose first turn sleeps; each test runs the real ``subagents`` CLI as
a second subprocess against the same store (tests/multi/test_store_control.py
does the same through the library). Every wait polls a store condition
under a deadline; every subprocess has one.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from subagents.store import (
    IdGenerator, LogWriter, Store, SubagentError, accept, acquire_lease, find_roots, inspect, list_children, mailbox_counts, read_lease,
    read_mailbox, read_projection, register_owner, release_lease, remove_owner,
)
from subagents.supervisor.cli import columns, render, top_view

REPO = str(Path(__file__).resolve().parents[2])
DEADLINE_S = 60.0
WAIT_S = 20.0

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
            print(json.dumps({"root": root.id, "child": child, "owner": sup.statistics().owner_id}), flush=True)
            await anyio.sleep(3600)

    anyio.run(main, sys.argv[1])
    """
)


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env.update(PYTHONPATH=REPO, SUBAGENTS_DURABILITY="none", SUBAGENTS_POOL_SIZE="1", SUBAGENTS_CONTROL_POLL_S="0.02")
    return env


def cli(store_path: str, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", store_path, *args], cwd=REPO, env=cli_env(),
                              capture_output=True, text=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"subagents {' '.join(args)} hung; stdout={exc.stdout!r} stderr={exc.stderr!r}")


def ok(store_path: str, *args: str) -> str:
    done = cli(store_path, *args)
    assert done.returncode == 0, f"subagents {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done.stdout


def until(predicate: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(0.02)


def events(store_path: str, session_id: str) -> list[dict[str, Any]]:
    return inspect(Store(store_path, create=False), session_id).events


def stop_reasons(store_path: str, session_id: str) -> list[str]:
    return [e["data"]["stop_reason"] for e in events(store_path, session_id) if e["type"] == "turn/end"]


def script(*actions: dict[str, Any]) -> str:
    return json.dumps({"script": list(actions)})


@pytest.fixture
def host(tmp_path: Path):
    """(store path, {"root", "child", "owner"}, host process) once the child's sleeping turn has started."""
    store_path = str(tmp_path / "st")
    proc = subprocess.Popen([sys.executable, "-c", HOST, store_path], stdout=subprocess.PIPE, text=True, env=cli_env(), cwd=REPO)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, "the host supervisor did not start"
        ids = json.loads(line)
        until(lambda: any(e["type"] == "turn/start" for e in events(store_path, ids["child"])))
        yield store_path, ids, proc
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


# -- send and interrupt -------------------------------------------------------------------------


def test_send_to_a_hosted_child_returns_once_durable_and_interrupt_lets_it_run(host) -> None:
    """send prints the id of a message durable in the child's mailbox; interrupt stops the sleeping turn; the host runs the message."""
    store_path, ids, _proc = host
    root, child = ids["root"], ids["child"]
    doc = json.loads(ok(store_path, "send", child, script({"return": "from the cli"}), "--parent", root, "--json"))
    assert doc["hosted"] == "elsewhere"
    assert doc["message_id"] in [m.id for m in read_mailbox(Store(store_path, create=False), child)]
    assert stop_reasons(store_path, child) == []  # still in its first turn: nothing waited for it

    said = ok(store_path, "interrupt", child, "--parent", root)
    assert said.startswith(f"cancelled turn 1 of agent {child} in supervisor {ids['owner']} (pid {_proc.pid}) (message "), said
    until(lambda: stop_reasons(store_path, child) == ["aborted", "completed"])
    accepted = [e["data"]["message_id"] for e in events(store_path, child) if e["type"] == "message/accepted"]
    assert accepted[-1] == doc["message_id"]
    assert read_lease(Store(store_path, create=False), child).owner == ids["owner"]  # it ran in the host


def test_send_text_prints_the_message_id(host) -> None:
    """Without --json, send to a hosted child prints only the message id."""
    store_path, ids, _proc = host
    out = ok(store_path, "send", ids["child"], script({"return": "x"}), "--parent", ids["root"])
    assert [m.id for m in read_mailbox(Store(store_path, create=False), ids["child"])][-1] == out.strip()


def test_control_verbs_take_unique_prefixes_back(host) -> None:
    """send and drain accept the short ids the tables print, for the child and for the parent, as ls and show do."""
    store_path, ids, _proc = host
    root, child = ids["root"], ids["child"]
    out = ok(store_path, "send", child[:12], script({"return": "x"}), "--parent", root[:12])
    assert [m.id for m in read_mailbox(Store(store_path, create=False), child)][-1] == out.strip()
    doc = json.loads(ok(store_path, "drain", root[:12], "--json"))
    assert doc["root"] == root


def test_send_cold_resumes_and_waits_for_the_settlement_notice(host) -> None:
    """With the host dead, send resumes the child in the CLI, waits for it to settle and prints the root's notice."""
    store_path, ids, proc = host
    root, child = ids["root"], ids["child"]
    _kill(proc)
    done = cli(store_path, "send", child, script({"return": "resumed by the cli"}), "--parent", root)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    message_id = lines[0]
    assert lines[1:] == [f"Background subagent {child} finished and will do no further work unless you send it more.",
                         "Its closing message:", "resumed by the cli"]
    assert message_id in [m.id for m in read_mailbox(Store(store_path, create=False), child)]
    assert stop_reasons(store_path, child) == ["interrupted", "completed"]  # crash repair, then the message
    assert read_lease(Store(store_path, create=False), child).state == "released"


def _send_paused_while_taken_over(store_path: str, root: str, child: str, first: str) -> tuple[int, str, str]:
    """``send`` of ``first`` (a script that says "ran ONE", then sleeps), stopped (SIGSTOP) past its lease once
    its turn said so, while a second ``send`` takes the child over and runs its own message ("two"); then
    resumed: the first one's exit code, stdout and stderr."""
    env = {**cli_env(), "SUBAGENTS_LEASE_TTL_S": "1.0"}
    proc = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", store_path, "send", child, first,
                             "--parent", root, "--json", "--wait-s", "50"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        until(lambda: any(e["type"] == "assistant/message" and e["data"].get("text") == "ran ONE" for e in events(store_path, child)))
        proc.send_signal(signal.SIGSTOP)
        time.sleep(2.5)  # past its lease: its heartbeat stopped with it
        second = subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", store_path, "send", child,
                                 script({"return": "two"}), "--parent", root, "--json"],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
        assert second.returncode == 0, second.stderr
        assert json.loads(second.stdout)["output"] == "two"
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=25)  # far less than the minute a turn of the second test sleeps
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(10)
    return proc.returncode, out, err


def test_a_send_whose_child_was_taken_over_says_so_and_prints_no_other_turns_notice(host) -> None:
    """Found by a probe: a ``send`` hosting the child's turn, paused (SIGSTOP) past its lease, while a second
    ``send`` took the child over and ran its own message, printed, once resumed, the second one's settlement
    notice ("finished", "two") as its own result; only a log warning said it had been taken over."""
    store_path, ids, proc = host
    root, child = ids["root"], ids["child"]
    _kill(proc)
    code, out, err = _send_paused_while_taken_over(store_path, root, child, script({"say": "ran ONE"}, {"sleep": 15000}, {"return": "one"}))
    doc = json.loads(out)
    assert code == 1, (out, err)
    assert doc["notice"] is None and doc["output"] != "two" and doc["taken_over"] is True, doc
    assert doc["diagnostic"].startswith(f"{child} was taken over by another process (its lease at epoch "), doc
    assert stop_reasons(store_path, child)[-2:] == ["interrupted", "completed"]  # the taker closed ONE, then ran its own


def test_a_turn_whose_child_was_taken_over_during_a_pause_is_stopped_once_its_host_resumes(host) -> None:
    """Found by a probe: a ``send`` paused (SIGSTOP) past its lease while another took the child over kept
    running its turn once resumed (a program's tool calls, a model's requests) until the turn next wrote, a
    minute later here, beside the turn of the process that took the child over. Its heartbeat's lapse now
    makes it read its leases at once and stop the turns on leases no longer its own."""
    store_path, ids, proc = host
    root, child = ids["root"], ids["child"]
    _kill(proc)
    code, out, err = _send_paused_while_taken_over(store_path, root, child,
                                                   script({"say": "ran ONE"}, {"sleep": 60000}, {"say": "ONE went on"}))
    doc = json.loads(out)
    assert code == 1 and doc["taken_over"] is True and doc["notice"] is None, (doc, err[-2000:])
    assert not any(e["type"] == "assistant/message" and e["data"].get("text") == "ONE went on" for e in events(store_path, child))


def test_a_one_shot_turn_repaired_by_another_process_during_a_pause_is_stopped_once_its_host_resumes(tmp_path: Path) -> None:
    """The same for a one-shot child: ``run`` paused past its lease while another process took the child's
    lease and closed its turn (nothing in this build takes a one-shot child over but the store's own calls,
    which any program may make), resumed, stops the turn at once (its result ``error``) instead of running it on."""
    store_path = str(tmp_path / "st")
    env = {**cli_env(), "SUBAGENTS_LEASE_TTL_S": "1.0"}
    run = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", store_path, "run", "script", "--prompt",
                            script({"say": "ran ONE"}, {"sleep": 60000}, {"say": "ONE went on"}), "--json"],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def child() -> str | None:
            try:
                st = Store(store_path, create=False)
                roots = [r.id for r in find_roots(st).rows]
                kids = [c.id for r in roots for c in list_children(st, r)]
            except SubagentError:
                return None
            return next((c for c in kids if any(e["data"].get("text") == "ran ONE" for e in events(store_path, c)
                                                if e["type"] == "assistant/message")), None)

        child_id = until(child)
        run.send_signal(signal.SIGSTOP)
        time.sleep(2.5)
        st = Store(store_path, create=False)
        taker = IdGenerator().new()
        register_owner(st, taker, ttl=60.0)
        taken = acquire_lease(st, child_id, taker)  # the paused host's heartbeat is older than its TTL
        with LogWriter.open(st, child_id, epoch=taken.epoch):
            pass  # opening repairs: the open turn is closed "interrupted"
        release_lease(st, child_id, taker, taken.epoch)
        remove_owner(st, taker)
        assert stop_reasons(store_path, child_id) == ["interrupted"]
        run.send_signal(signal.SIGCONT)
        out, err = run.communicate(timeout=25)  # far less than the minute its turn would sleep on
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGCONT)
            run.kill()
            run.wait(10)
    doc = json.loads(out)
    assert run.returncode == 1 and doc["stop_reason"] == "error" and doc["diagnostic"].startswith("FENCED: "), (out, err[-2000:])
    assert not any(e["type"] == "assistant/message" and e["data"].get("text") == "ONE went on" for e in events(store_path, child_id))
    assert stop_reasons(store_path, child_id) == ["interrupted"]  # nothing written after the repair's closers


def test_send_takes_the_notice_it_printed_from_the_roots_mailbox(host) -> None:
    """The notice send printed is delivered: taken into the root's log, not left waiting in its mailbox
    for a reader that never comes (a waiting message keeps ``gc`` from ever collecting the subtree)."""
    store_path, ids, proc = host
    root, child = ids["root"], ids["child"]
    _kill(proc)
    doc = json.loads(ok(store_path, "send", child, script({"return": "read"}), "--parent", root, "--json"))
    st = Store(store_path, create=False)
    taken = [e["data"]["message_id"] for e in events(store_path, root) if e["type"] == "message/accepted"]
    assert taken == [doc["notice"]["id"]]
    assert mailbox_counts(st, root, read_projection(st, root)).pending == 0
    assert read_lease(st, root).state == "released"  # the root is free for its own program again
    report = json.loads(ok(store_path, "gc", "--older-than", "0s", "--dry-run", "--json"))
    assert root in json.dumps(report["collected"]) and root not in json.dumps(report["skipped"]), report


def test_send_prints_every_root_message_it_takes_with_the_notice(host) -> None:
    """A message that waited in the root's mailbox before the notice (a report its dead host never took)
    is taken with the notice, so send prints it too: taken means delivered, never dropped unseen."""
    store_path, ids, proc = host
    root, child = ids["root"], ids["child"]
    _kill(proc)
    st = Store(store_path, create=False)
    earlier = accept(st, root, source={"kind": "subagent-report", "sender_session_id": child}, content="half way", ids=IdGenerator())
    out = ok(store_path, "send", child, script({"return": "done"}), "--parent", root)
    assert f"also delivered to {root} (subagent-report {earlier}):" in out.splitlines(), out
    assert out.splitlines()[-1] == "half way"
    taken = [e["data"]["message_id"] for e in events(store_path, root) if e["type"] == "message/accepted"]
    assert taken[0] == earlier and len(taken) == 2  # the report, then the notice


def test_send_json_after_a_cold_resume(host) -> None:
    """--json prints one document: the message id, the epoch it ran at, its stop reason and the notice."""
    store_path, ids, proc = host
    _kill(proc)
    doc = json.loads(ok(store_path, "send", ids["child"], script({"return": "json"}), "--parent", ids["root"], "--json"))
    assert doc["hosted"] == "here" and doc["settled"] and doc["epoch"] == 2 and doc["stop_reason"] == "completed"
    notice = doc["notice"]
    assert notice["content"].endswith("Its closing message:\njson")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", notice["ts"]), notice["ts"]  # as every --json time
    assert notice["id"] in [m.id for m in read_mailbox(Store(store_path, create=False), ids["root"])]



def test_send_json_has_the_same_keys_wherever_the_child_runs(host) -> None:
    """Found by a probe: --json gave 14 keys when send hosted the child itself but 4 when another supervisor
    did (``doc["settled"]`` was a KeyError there). The keys are the same; what this command did not see
    happen, since it did not wait for a turn it does not host, is null."""
    store_path, ids, proc = host
    message = script({"return": "x"})
    elsewhere = json.loads(ok(store_path, "send", ids["child"], message, "--parent", ids["root"], "--json"))
    _kill(proc)
    here = json.loads(ok(store_path, "send", ids["child"], message, "--parent", ids["root"], "--json"))
    assert (elsewhere["hosted"], here["hosted"]) == ("elsewhere", "here")
    assert list(elsewhere) == list(here), (list(elsewhere), list(here))
    assert elsewhere["epoch"] == 1
    unseen = set(elsewhere) - {"message_id", "child", "parent", "hosted", "epoch"}
    assert {key: elsewhere[key] for key in unseen} == dict.fromkeys(unseen), elsewhere

def test_send_says_why_the_resumed_turn_failed(host) -> None:
    """Found by a probe: send printed only "failed before it finished. It left no closing message." and exited 1,
    the cause being in `log`/`show` alone. It prints the diagnostic as `run` does (and --json carries it)."""
    store_path, ids, proc = host
    _kill(proc)
    child = ids["child"]
    done = cli(store_path, "send", child, script({"fail": "the disk is full"}), "--parent", ids["root"])
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1:] == [f"Background subagent {child} failed before it finished.", "It left no closing message.",
                         "stop reason: error (RuntimeError: the disk is full)"]
    doc = json.loads(ok_or(store_path, 1, "send", child, script({"fail": "again"}), "--parent", ids["root"], "--json"))
    assert (doc["stop_reason"], doc["diagnostic"]) == ("error", "RuntimeError: again")


def ok_or(store_path: str, code: int, *args: str) -> str:
    done = cli(store_path, *args)
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    return done.stdout


def test_send_times_out_when_the_resumed_child_does_not_settle(host) -> None:
    """Past --wait-s, send prints the id, then TIMEOUT (exit 2); closing stops the turn, which ends aborted."""
    store_path, ids, proc = host
    _kill(proc)
    done = cli(store_path, "send", ids["child"], script({"sleep": 60000}), "--parent", ids["root"], "--wait-s", "0.5")
    assert done.returncode == 2
    assert "error: TIMEOUT: " in done.stderr
    assert done.stdout.strip() in [m.id for m in read_mailbox(Store(store_path, create=False), ids["child"])]
    assert stop_reasons(store_path, ids["child"])[-1] == "aborted"


def test_a_send_that_times_out_records_its_close_as_disposed_not_as_the_parent(host) -> None:
    """Found by a probe: the turn a timed-out send left running ended ``the turn was cancelled (parent)``,
    though no parent stopped it: the command closing its supervisor did, which a one-shot ``run`` records as
    ``disposed``. The same close now records the same cause, and the listing still reads it ``aborted``."""
    store_path, ids, proc = host
    _kill(proc)
    done = cli(store_path, "send", ids["child"], script({"sleep": 60000}), "--parent", ids["root"], "--wait-s", "0.5")
    assert done.returncode == 2 and "error: TIMEOUT: " in done.stderr
    end = [e["data"] for e in events(store_path, ids["child"]) if e["type"] == "turn/end"][-1]
    assert (end["stop_reason"], end.get("cause"), end["diagnostic"]) == ("aborted", "disposed", "the turn was cancelled (disposed)")
    row = [r for r in json.loads(ok(store_path, "ls", "--json", ids["root"])) if r["id"] == ids["child"]]
    assert row and row[0]["outcome"] == "aborted", row


@pytest.mark.parametrize("command", ["send", "interrupt"])
def test_wrong_parent_is_unauthorized_and_writes_nothing(host, command: str) -> None:
    """A --parent that is not the child's root exits 2 with UNAUTHORIZED; no message or control record."""
    store_path, ids, _proc = host
    st = Store(store_path, create=False)
    before = read_mailbox(st, ids["child"])
    args = [ids["child"], "x"] if command == "send" else [ids["child"]]
    done = cli(store_path, command, *args, "--parent", ids["child"])
    assert done.returncode == 2
    assert done.stderr.startswith("error: UNAUTHORIZED: ")
    assert read_mailbox(st, ids["child"]) == before
    assert not os.path.exists(st.path(ids["child"], "control"))


def test_send_to_an_unknown_child_is_session_not_found(host) -> None:
    """send to an id with no session: SESSION_NOT_FOUND (issue #13), not NOT_RESUMABLE."""
    store_path, ids, _proc = host
    done = cli(store_path, "send", "01J00000000000000000000000", "x", "--parent", ids["root"])
    assert done.returncode == 2 and done.stderr.startswith("error: SESSION_NOT_FOUND: ")


@pytest.mark.parametrize("damage", [b"", bytes(range(7, 250)) * 2])
def test_send_to_a_child_whose_mailbox_lost_its_messages_is_refused(host, damage: bytes) -> None:
    """Audit defect 7: with the child's mailbox emptied or overwritten, send acknowledged messages no turn
    could ever take. Now each send exits 2 with CORRUPT_SESSION (one line, no traceback), writes nothing,
    and fsck and check name the damage for that child."""
    store_path, ids, _proc = host
    st = Store(store_path, create=False)
    path = st.path(ids["child"], "mailbox")
    with open(path, "wb") as handle:
        handle.write(damage)
    for _ in range(2):
        done = cli(store_path, "send", ids["child"], script({"return": "lost"}), "--parent", ids["root"])
        assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
        assert done.stderr.startswith("error: CORRUPT_SESSION: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "mailbox and log disagree" in done.stderr and "Traceback" not in done.stderr
        with open(path, "rb") as handle:
            assert handle.read() == damage
    done = cli(store_path, "store", "fsck", "--json")
    fsck = json.loads(done.stdout)
    assert [f["kind"] for f in fsck["findings"] if f["id"] == ids["child"]] == ["mailbox-damaged"]
    # found by a probe: fsck exited 0 ("0 corrupt") while every message to the child is refused
    assert done.returncode == 1 and fsck["damaged_mailboxes"] == [ids["child"]], fsck
    human = cli(store_path, "store", "fsck")
    assert human.returncode == 1 and "messages sent to 1 session(s) are refused" in human.stdout, human.stdout
    check = json.loads(cli(store_path, "store", "check", "--json").stdout)
    assert not check["clean"] and any(v["session_id"] == ids["child"] for v in check["violations"]), check


# -- drain -------------------------------------------------------------------------------------


def test_drain_tears_down_a_child_hosted_elsewhere(host) -> None:
    """drain asks the host to dispose the child and waits until it reads complete."""
    store_path, ids, proc = host
    doc = json.loads(ok(store_path, "drain", ids["root"], "--json"))
    assert doc["drained"] == [ids["child"]] and doc["settled"]
    assert [(c["id"], c["status"]) for c in doc["children"]] == [(ids["child"], "complete")]
    assert all(c["created_at"].endswith("Z") for c in doc["children"])  # ISO, as the same rows in `tree --json`
    assert stop_reasons(store_path, ids["child"]) == ["aborted"]
    assert proc.poll() is None  # the host lives on; only its child was drained


def test_drain_of_a_child_whose_host_died_discards_its_queued_messages(host) -> None:
    """Found by a probe: with the host killed, drain said every child was torn down ([complete], exit 0), but
    nobody discarded the queued followups, and the next send ran them all. The drain does it itself now, under
    the child's lease: the turn the host left open is closed, the queued messages are discarded (``drained``),
    and a later send runs only its own message."""
    store_path, ids, proc = host
    root, child = ids["root"], ids["child"]
    queued = [json.loads(ok(store_path, "send", child, script({"return": f"queued {i}"}), "--parent", root, "--json"))["message_id"]
              for i in range(2)]
    _kill(proc)
    doc = json.loads(ok(store_path, "drain", root, "--json"))
    assert [(c["id"], c["status"], c["outcome"]) for c in doc["children"]] == [(child, "complete", "drained")], doc
    assert (doc["drained"], doc["drained_here"]) == ([], [child]), doc
    discarded = [e["data"] for e in events(store_path, child) if e["type"] == "message/discarded"]
    assert [(d["message_id"], d["cause"]) for d in discarded] == [(m, "drain") for m in queued]
    assert stop_reasons(store_path, child) == ["interrupted"]
    ok(store_path, "send", child, script({"return": "after the drain"}), "--parent", root)
    assert stop_reasons(store_path, child) == ["interrupted", "completed"]
    texts = [e["data"]["text"] for e in events(store_path, child) if e["type"] == "assistant/message"]
    assert texts == ["after the drain"], texts


@pytest.mark.parametrize("json_mode", [False, True], ids=["text", "json"])
def test_drain_of_an_unhosted_child_whose_mailbox_does_not_read_names_it_without_a_traceback(host, json_mode: bool) -> None:
    """Found by a probe: with the mailbox of a child nobody hosts replaced by a folder, drain printed two
    tracebacks, then "nothing to drain", and exited 0. It now names the child and why, and exits 1."""
    store_path, ids, proc = host
    _kill(proc)
    path = Store(store_path, create=False).path(ids["child"], "mailbox")
    os.remove(path)
    os.mkdir(path)
    done = cli(store_path, "drain", ids["root"], *(["--json"] if json_mode else []))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "nothing to drain" not in done.stdout, (done.stdout, done.stderr)
    if json_mode:
        doc = json.loads(done.stdout)
        assert (doc["drained"], doc["drained_here"]) == ([], [])
        assert [f["id"] for f in doc["failed"]] == [ids["child"]] and doc["failed"][0]["problem"] == "its files do not read (unavailable)", doc
    else:
        first = done.stdout.splitlines()[0]
        assert first == f"could not drain {ids['child']}: its files do not read (unavailable) (see `subagents store fsck`)", done.stdout


def test_drain_text_with_nothing_hosted(host) -> None:
    """A child nobody hosts (its host killed mid-turn) is drained by the command itself, and the text
    says so: before, it said "nothing to drain" while it closed the turn the dead host left open (a
    probe). A second drain finds nothing left to do, and says that."""
    store_path, ids, proc = host
    _kill(proc)
    out = ok(store_path, "drain", ids["root"])
    assert out.splitlines() == [f"drained 1 continuable descendant of {ids['root']} that no supervisor hosted, here: {ids['child']}",
                                f"{ids['child']} [complete] — sleeper"]
    doc = json.loads(ok(store_path, "drain", ids["root"], "--json"))
    assert (doc["drained"], doc["drained_here"]) == ([], [])
    out = ok(store_path, "drain", ids["root"])
    assert out.splitlines()[0] == f"nothing to drain below {ids['root']}: no continuable descendant of it is hosted or has messages waiting"


# -- top ---------------------------------------------------------------------------------------


def test_top_once_json_lists_the_held_sessions(host) -> None:
    """top --once --json: the root (idle) and the child (running), held by the host at epoch 1."""
    store_path, ids, proc = host
    rows = {r["id"]: r for r in json.loads(ok(store_path, "top", "--once", "--json"))}
    assert set(rows) == {ids["root"], ids["child"]}
    child = rows[ids["child"]]
    assert (child["status"], child["mode"], child["label"], child["parent"], child["epoch"]) == ("running", "continuable", "sleeper", ids["root"], 1)
    assert child["owner"] == ids["owner"] and child["owner_pid"] == proc.pid
    assert child["active_since"].endswith("Z") and child["settled_ms"] == 0  # ISO 8601 (issue 15)
    assert child["outcome"] is None  # its first turn is still running (issue 13)
    assert (rows[ids["root"]]["status"], rows[ids["root"]]["mode"]) == ("idle", "root")


def test_top_once_text_and_a_dead_owner(host) -> None:
    """Plain text is one aligned row per held session, ids as unique prefixes; once the host dies, nothing is listed."""
    store_path, ids, proc = host
    lines = ok(store_path, "top", "--once").splitlines()
    assert lines[0].split() == ["id", "status", "last", "mode", "label", "busy", "turn", "node", "epoch", "pid", "parent", "owner"]
    child = next(line.split() for line in lines[1:] if ids["child"].startswith(line.split()[0]))
    assert len(child[0]) < len(ids["child"])
    assert child[1:6] == ["running", "-", "continuable", "sleeper", "0.0s"]
    assert child[7] == _turn_node(store_path, ids["child"])
    assert child[-4:-2] == ["1", str(proc.pid)] and ids["root"].startswith(child[-2]) and child[-1] == ids["owner"]
    assert "busy " in ok(store_path, "top", "--help")  # the columns are explained
    _kill(proc)
    assert ok(store_path, "top", "--once") == "(no running or idle sessions)\n"


def _turn_node(store_path: str, session_id: str) -> str:
    """The ``node`` the running turn's ``turn/start`` recorded: ``<host>:<worker pid>`` of a live worker of the local pool."""
    [start] = [e for e in events(store_path, session_id) if e["type"] == "turn/start"]
    node = start["data"]["node"]
    host, pid = node.rsplit(":", 1)
    assert host == socket.gethostname() and os.path.exists(f"/proc/{pid}")
    return node


def test_ls_show_and_top_show_the_node_of_a_running_child(host) -> None:
    """Issue 11 item 5: where a running child's turn runs, in ls, show and top (text and JSON); nothing once it stops."""
    store_path, ids, proc = host
    node = _turn_node(store_path, ids["child"])
    assert int(node.rsplit(":", 1)[1]) != proc.pid  # the turn runs in a worker of the pool, not in the host
    [row] = json.loads(ok(store_path, "ls", ids["root"], "--json"))
    assert (row["status"], row["node"]) == ("running", node)
    lines = ok(store_path, "ls", ids["root"]).splitlines()
    assert lines[0].split() == ["ID", "STATUS", "OUTCOME", "MODE", "CREATED", "NODE", "LABEL", "ERROR"]
    assert node in lines[1].split()
    shown = json.loads(ok(store_path, "show", ids["child"], "--json"))
    assert shown["node"] == node
    assert f"node      {node}" in ok(store_path, "show", ids["child"])
    tops = {r["id"]: r for r in json.loads(ok(store_path, "top", "--once", "--json"))}
    assert (tops[ids["child"]]["node"], tops[ids["root"]]["node"]) == (node, None)  # the root runs no turn
    _kill(proc)
    [row] = json.loads(ok(store_path, "ls", ids["root"], "--json"))
    assert (row["status"], row["outcome"], row["node"]) == ("complete", "crashed", None)
    assert "NODE" not in ok(store_path, "ls", ids["root"]).splitlines()[0].split()
    assert json.loads(ok(store_path, "show", ids["child"], "--json"))["node"] is None


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_top_on_a_terminal_is_a_rich_table_and_refreshes_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the snapshot is a rich table (ids intact) and TopView renders through rich Live."""
    row = {"id": "01CHILD", "label": "[x]", "mode": "continuable", "parent": "01ROOT", "status": "running", "epoch": 3,
           "owner": "01OWNER", "owner_pid": 42, "owner_host": "h", "settled_ms": 1500.0, "active_since": time.time() - 2}
    monkeypatch.setenv("COLUMNS", "160")  # a wide terminal: every column whole
    screen = _Terminal()
    top_view.render_top(render.Output(screen), [row])
    text = screen.getvalue()
    assert all(cell in text for cell in ("01CHILD", "[x]", "01OWNER", " 42 ", "1.5s", "2.0s", "01ROOT"))
    monkeypatch.setenv("COLUMNS", "80")
    narrow = _Terminal()
    long_label = "a label of thirty-two characters"
    top_view.render_top(render.Output(narrow), [{**row, "id": "01M8MVY0PZ9RKY15DPNHER70WX", "label": long_label}],
                        {"01M8MVY0PZ9RKY15DPNHER70WX": "01M8MVY0"})
    assert "01M8MVY0" in narrow.getvalue() and long_label in narrow.getvalue()  # the short id and the label are kept
    live = _Terminal()
    with top_view.TopView(render.Output(live)) as view:
        view.update([row], time.time())
    assert "01CHILD" in live.getvalue()
    plain = io.StringIO()
    with top_view.TopView(render.Output(plain, json_mode=True)) as view:
        view.update([row], time.time())
    assert json.loads(plain.getvalue()) == [{**row, "active_since": columns.iso(row["active_since"])}]  # ISO, as every --json time


def test_send_says_when_the_settlement_notice_could_not_reach_the_root(host) -> None:
    """Found by a probe: when the root's mailbox refuses the notice (here a folder in its place; in the
    probe, a mailbox emptied behind the store's back), send printed the message id alone and exited 0
    (--json: "notice": null, no reason). It prints the child's closing message, why the root did not
    get it, and exits 1."""
    store_path, ids, proc = host
    _kill(proc)
    root, child = ids["root"], ids["child"]
    os.mkdir(Store(store_path, create=False).path(root, "mailbox"))
    done = cli(store_path, "send", child, script({"return": "the answer"}), "--parent", root)
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert lines[1] == "the answer", lines
    assert lines[2].startswith(f"not delivered to {root}: SESSION_UNAVAILABLE: "), lines
    doc = json.loads(ok_or(store_path, 1, "send", child, script({"return": "again"}), "--parent", root, "--json"))
    assert doc["notice"] is None and doc["output"] == "again", doc
    assert doc["notice_problem"].startswith("SESSION_UNAVAILABLE: "), doc


@pytest.mark.parametrize("command", ["send", "interrupt"])
def test_the_wrong_kind_of_id_is_unauthorized_saying_whose_it_is(host, command: str) -> None:
    """``UNAUTHORIZED: subagent "ROOT" belongs to another parent session`` of a root (which has no parent),
    or of a child given with a --parent that is not its own, left the user nothing to fix it with: the
    CLI says what the id is (found by a probe)."""
    store_path, ids, _proc = host
    root, child = ids["root"], ids["child"]
    args = ["x"] if command == "send" else []
    done = cli(store_path, command, root, *args, "--parent", root)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f'error: UNAUTHORIZED: subagent "{root}" belongs to another parent session: '
                           f"{root} is a top-level session, which has no parent\n"), done.stderr
    done = cli(store_path, command, child, *args, "--parent", child)
    assert done.stderr == (f'error: UNAUTHORIZED: subagent "{child}" belongs to another parent session: '
                           f"its parent is {root}, not {child}\n"), done.stderr
