"""``subagents interrupt`` through the real CLI: it reaches a one-shot turn another process hosts, and says what happened (issue #13).

The host is a ``subagents run`` in a subprocess, as in another terminal: its
one-shot child sleeps 60 s. A second ``subagents`` process interrupts it;
the host's supervisor polls the child's control file and cancels the turn.
Every wait polls the store under a deadline; every subprocess has one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from subagents.store import Store, SubagentError, read_header, read_lease
from subagents.store.control import read_controls

from .test_cli_control import DEADLINE_S, REPO, cli, cli_env, events, until

SLEEP_MS = 60_000
EXIT_NO_TURN = 3


def running_child(store_path: str) -> tuple[str, str] | None:
    """(root, child) once the store holds a child whose turn has started."""
    try:
        st = Store(store_path, create=False)
    except SubagentError:  # `run` is still making the store
        return None
    for session_id in st.session_ids():
        try:
            parent = read_header(st, session_id).parent_session
        except Exception:  # a session being created: its header is not there yet
            continue
        if parent is not None and any(e["type"] == "turn/start" for e in events(store_path, session_id)):
            return parent, session_id
    return None


@pytest.fixture
def one_shot_host(tmp_path: Path):
    """(store path, root, child, the `subagents run` process, when its turn was seen running)."""
    store_path = str(tmp_path / "st")
    prompt = '{"script": [{"say": "awake"}, {"sleep": %d}]}' % SLEEP_MS
    proc = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", store_path, "run", "script", "--prompt", prompt],
                            cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        root, child = until(lambda: running_child(store_path) if proc.poll() is None else pytest.fail(proc.communicate()), DEADLINE_S)
        yield store_path, root, child, proc, time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=DEADLINE_S)


def test_interrupting_a_one_shot_child_another_process_hosts(one_shot_host) -> None:
    """The child ends aborted by the user well before its 60 s sleep; the CLI names the turn and exits 0; the run reports it."""
    store_path, root, child, proc, seen_at = one_shot_host
    done = cli(store_path, "interrupt", child, "--parent", root)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.startswith(f"cancelled turn 1 of agent {child} in supervisor "), done.stdout
    stdout, stderr = proc.communicate(timeout=DEADLINE_S)
    assert time.monotonic() - seen_at < SLEEP_MS / 2000, "the turn ran on after the interrupt"
    assert proc.returncode == 1, (stdout, stderr)  # `run` of a turn that did not complete
    ends = [e["data"] for e in events(store_path, child) if e["type"] == "turn/end"]
    assert [(e["stop_reason"], e.get("cause")) for e in ends] == [("aborted", "user")]

    again = cli(store_path, "interrupt", child, "--parent", root)
    assert again.returncode == EXIT_NO_TURN, (again.stdout, again.stderr)
    assert again.stdout == f"no turn running for agent {child}: no live supervisor holds it; its last turn ended aborted\n"
    assert again.stderr == ""


BAD_TARGETS = [("01NOSUCHCHILD0000000000000", "SESSION_NOT_FOUND"), ("../../etc", "INVALID_SESSION_ID"), ("é", "INVALID_SESSION_ID"),
               ("x" * 5000, "INVALID_SESSION_ID")]


def test_refusals_leave_the_turn_running_and_json_says_what_happened(one_shot_host) -> None:
    """Unknown and malformed ids are refused (exit 2, one short line) and touch nothing; then --json reports the cancel."""
    store_path, root, child, proc, _ = one_shot_host
    for target, code in BAD_TARGETS:
        done = cli(store_path, "interrupt", target, "--parent", root)
        assert done.returncode == 2 and done.stdout == "", (target[:20], done.returncode, done.stdout)
        assert done.stderr.startswith(f"error: {code}: ") and len(done.stderr) < 300, done.stderr
    assert not any(e["type"] == "turn/end" for e in events(store_path, child))

    done = cli(store_path, "interrupt", child, "--parent", root, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["outcome"], doc["child_id"], doc["turn"], doc["stop_reason"]) == ("cancelled", child, 1, "aborted")
    assert doc["host"]
    proc.communicate(timeout=DEADLINE_S)
    done = cli(store_path, "interrupt", child, "--parent", root, "--json")
    assert done.returncode == EXIT_NO_TURN and json.loads(done.stdout)["outcome"] == "no_turn_running"


CONTINUABLE_HOST = textwrap.dedent(
    """
    import json, sys, anyio
    from subagents.supervisor import *

    async def main(store):
        # a long lease: the test stops this process for a while and it must still count as live
        cfg = SupervisorConfig(pool_size=1, durability="none", control_poll_s=0.02, lease_ttl_s=120)
        async with Supervisor.open(store=store, config=cfg) as sup:
            sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
            root = await sup.open_root(label="host")
            first = json.dumps({"script": [{"sleep": 60000}]})
            child, message = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=first, label="sleeper"))
            print(json.dumps({"root": root.id, "child": child, "message": message, "owner": sup.statistics().owner_id}), flush=True)
            await anyio.sleep(3600)

    anyio.run(main, sys.argv[1])
    """
)


@pytest.mark.parametrize("wait_s, waited", [("0.5", "its log showed no end of the turn within 0.5 s"), ("0", "not waited for")])
def test_a_host_that_does_not_confirm_in_time_gets_a_request_it_carries_out_later(tmp_path: Path, wait_s: str, waited: str) -> None:
    """With the host stopped (SIGSTOP), interrupt says the request was delivered and not confirmed (exit 0);
    the host carries it out once it runs again. ``--wait-s 0`` (the API's default: deliver, do not wait) was
    refused as a usage error (found by a README probe)."""
    store_path = str(tmp_path / "st")
    proc, ids = _continuable_host(store_path)
    child = ids["child"]
    try:
        proc.send_signal(signal.SIGSTOP)
        try:
            done = cli(store_path, "interrupt", child, "--parent", ids["root"], "--wait-s", wait_s)
        finally:
            proc.send_signal(signal.SIGCONT)
        assert done.returncode == 0, done.stderr
        assert done.stdout == (f"interrupt of turn 1 of agent {child} delivered to supervisor {ids['owner']} (pid {proc.pid}) "
                               f"(message {ids['message']}); {waited}\n")
        until(lambda: [(e["data"]["stop_reason"], e["data"].get("cause")) for e in events(store_path, child) if e["type"] == "turn/end"], DEADLINE_S)
        ends = [(e["data"]["stop_reason"], e["data"].get("cause")) for e in events(store_path, child) if e["type"] == "turn/end"]
        assert ends == [("aborted", "user")]
    finally:
        _reap([proc])


def _interrupt_in_background(store_path: str, child: str, root: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", store_path, "interrupt", child, "--parent", root,
                             "--wait-s", "30"], cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _control_records(store_path: str, child: str) -> int:
    return len(read_controls(Store(store_path, create=False), child))


def _delivered_while_stopped(host: subprocess.Popen[str], store_path: str, ids: dict[str, str], count: int) -> list[subprocess.Popen[str]]:
    """``count`` `subagents interrupt` of the child, each waiting for its answer, delivered one after the other (the
    control file's order is the order the host applies them) while the host is stopped (SIGSTOP: the caller resumes
    or kills it)."""
    host.send_signal(signal.SIGSTOP)
    waiting: list[subprocess.Popen[str]] = []
    for n in range(1, count + 1):
        waiting.append(_interrupt_in_background(store_path, ids["child"], ids["root"]))
        until(lambda: _control_records(store_path, ids["child"]) == n, DEADLINE_S)
    return waiting


def _reap(processes: list[subprocess.Popen[str]]) -> None:
    for p in processes:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=DEADLINE_S)


def _one_shot_host(store_path: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """`subagents run` of a sleeping one-shot child, with a lease that outlives the test's SIGSTOP."""
    prompt = '{"script": [{"say": "awake"}, {"sleep": %d}]}' % SLEEP_MS
    proc = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", store_path, "run", "script", "--prompt", prompt],
                            cwd=REPO, env={**cli_env(), "SUBAGENTS_LEASE_TTL_S": "120"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root, child = until(lambda: running_child(store_path) if proc.poll() is None else pytest.fail(proc.communicate()), DEADLINE_S)
    owner = read_lease(Store(store_path, create=False), child)
    assert owner is not None
    return proc, {"root": root, "child": child, "owner": owner.owner}


def _continuable_host(store_path: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen([sys.executable, "-c", CONTINUABLE_HOST, store_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(), cwd=REPO)
    ids = json.loads(proc.stdout.readline() or "null")  # type: ignore[union-attr]
    assert ids, "the host supervisor did not start"
    until(lambda: any(e["type"] == "turn/start" for e in events(store_path, ids["child"])), DEADLINE_S)
    return proc, ids


@pytest.mark.parametrize("start_host", [_one_shot_host, _continuable_host], ids=["one-shot", "continuable"])
def test_of_two_interrupts_of_one_turn_only_the_first_says_it_stopped_it(tmp_path: Path, start_host) -> None:
    """Two `subagents interrupt` of the same running turn, delivered while its host was stopped: the
    host carries out the first and finds the turn already stopping for the second, and so do their
    answers. Both said "cancelled" (found by a probe)."""
    store_path = str(tmp_path / "st")
    proc, ids = start_host(store_path)
    child = ids["child"]
    waiting: list[subprocess.Popen[str]] = []
    try:
        try:
            waiting = _delivered_while_stopped(proc, store_path, ids, 2)
        finally:
            proc.send_signal(signal.SIGCONT)
        (first_out, first_err), (second_out, second_err) = (p.communicate(timeout=DEADLINE_S) for p in waiting)
        assert waiting[0].returncode == 0, first_err
        assert first_out.startswith(f"cancelled turn 1 of agent {child} in supervisor {ids['owner']} "), first_out
        assert waiting[1].returncode == EXIT_NO_TURN, (second_out, second_err)
        assert second_out == (f"no turn running for agent {child}: its turn 1 was already being stopped by an earlier interrupt "
                              f"(control record 0), which supervisor {ids['owner']} carried out\n"), second_out
        ends = [(e["data"]["stop_reason"], e["data"].get("cause")) for e in events(store_path, child) if e["type"] == "turn/end"]
        assert ends == [("aborted", "user")]
    finally:
        _reap([proc, *waiting])


def test_an_interrupt_whose_host_dies_before_carrying_it_out_says_so(tmp_path: Path) -> None:
    """The host, stopped while the request reached it, is killed: the answer says the turn's host died
    with the request undone (exit 3), at once, where it said "requested ... no end of the turn within
    30 s" after the whole wait (found by a probe)."""
    store_path = str(tmp_path / "st")
    proc, ids = _continuable_host(store_path)
    child = ids["child"]
    waiting: list[subprocess.Popen[str]] = []
    try:
        waiting = _delivered_while_stopped(proc, store_path, ids, 1)
        proc.kill()
        proc.communicate(timeout=DEADLINE_S)
        asked_at = time.monotonic()
        out, err = waiting[0].communicate(timeout=DEADLINE_S)
        assert time.monotonic() - asked_at < 20, "the answer waited out its whole wait"
        assert waiting[0].returncode == EXIT_NO_TURN, (out, err)
        assert out == (f"no turn running for agent {child}: its host, supervisor {ids['owner']} (pid {proc.pid}), died before "
                       "carrying out the interrupt; its turn is left as the crash left it (the next supervisor to take the child "
                       "closes it interrupted)\n"), out
    finally:
        _reap([proc, *waiting])


def test_send_to_a_one_shot_child_another_process_runs_is_not_resumable_and_writes_nothing(one_shot_host) -> None:
    """A one-shot child takes no message, running or not: ``send`` to one that another process was
    running accepted the message into its mailbox and then said CORRUPT_SESSION ("mailbox and log
    disagree"), though nothing was damaged (found by a probe)."""
    store_path, root, child, proc, _ = one_shot_host
    done = cli(store_path, "send", child, "hello", "--parent", root)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr == (f'error: NOT_RESUMABLE: subagent "{child}" has no supported continuation state and cannot be resumed; '
                           "do not retry send_message with this id\n"), done.stderr
    assert not os.path.exists(Store(store_path, create=False).path(child, "mailbox"))
    assert cli(store_path, "store", "check").returncode == 0
