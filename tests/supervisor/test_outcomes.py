"""Outcomes in every listing (issue 13 item 2): a finished child says how it ended, not just ``complete``.

One supervisor makes a child of each outcome through the real API; the
library's catalog (``list_children``, ``list_descendants``) and the real CLI
(``ls``, ``tree``, ``top``, text and ``--json``) each report the same outcome,
with the error's code and first line for a failure. The host-killed-mid-turn
case (``crashed``) is in ``tests/multi/test_outcome_crash.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from subagents.store import Store, inspect
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, RunBudget, SubagentRequest, UserAuthority

from ..conftest import REPO_ROOT, open_supervisor, wait_until

pytestmark = pytest.mark.anyio


def S(*actions: dict) -> str:
    return json.dumps({"script": list(actions)})


def cli(store: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env["PYTHONPATH"] = REPO_ROOT
    env["COLUMNS"] = "200"
    done = subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", store, *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def turn_started(st: Store, session_id: str) -> bool:
    return any(e["type"] == "turn/start" for e in inspect(st, session_id).events)


async def test_each_outcome_in_the_catalog_and_the_cli(tmp_path) -> None:
    """completed, error (code + first line), budget, timeout, aborted (user interrupt), drained,
    interrupted (crash repair after a worker died) and not-started: the catalog and `ls`/`tree` agree."""
    async with open_supervisor(tmp_path, pool_size=2) as sup:
        sup.register_provider(Provider(name="cscript", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="outcomes")
        expected: dict[str, tuple[str, str | None]] = {}

        async def one_shot(label: str, prompt: str, budget: RunBudget | None = None) -> str:
            run = await sup.start("script", SubagentRequest(parent=root, prompt=prompt, label=label, budget=budget))
            await run.result()
            await run.dispose()
            return run.id

        expected[await one_shot("ok", S({"return": "fine"}))] = ("completed", None)
        expected[await one_shot("boom", S({"fail": "boom\nsecond line"}))] = ("error", "RuntimeError")
        expected[await one_shot("steps", S({"step": 5}), RunBudget(max_steps=2))] = ("budget", None)
        expected[await one_shot("slow", S({"sleep": 20_000}), RunBudget(timeout_ms=50))] = ("timeout", None)

        # a continuable child interrupted by the user mid-turn
        stopped, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="cscript", prompt=S({"sleep": 20_000}), label="stopped"))
        await wait_until(lambda: turn_started(sup.store, stopped), what="the turn to start")
        await sup.interrupt(stopped, authority=UserAuthority(parent_session=root.id))
        expected[stopped] = ("aborted", None)

        # a worker that dies mid-turn: crash repair closes the turn as interrupted
        died, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="cscript", prompt=S({"exit": 9}), label="died"))
        expected[died] = ("interrupted", None)

        async def settled(child: str) -> bool:
            rows = {e.id: e for e in await sup.list_children(root.id)}
            return child in rows and rows[child].status == "complete" and rows[child].outcome is not None

        for child in (stopped, died):
            await wait_until(lambda: settled(child), what=f"{child} to settle")

        # a child drained with work queued behind its running turn: the queued message is dropped unrun
        sub = await sup.open_root(label="drained")
        drained, _ = await sup.start_continuable(ContinuableSpec(parent=sub, provider="cscript", prompt=S({"sleep": 20_000}), label="drained"))
        await wait_until(lambda: turn_started(sup.store, drained), what="the drained child's turn to start")
        await sup.followup(sub, drained, S({"return": "never runs"}))
        await sup.drain([sub])

    # never started: a one-shot whose supervisor closed before its turn was dispatched
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root2 = await sup.open_root(label="never")
        hog = await sup.start("script", SubagentRequest(parent=root2, prompt=S({"sleep": 20_000}), label="hog"))
        await wait_until(lambda: turn_started(sup.store, hog.id), what="the hog's turn to start")
        queued = await sup.start("script", SubagentRequest(parent=root2, prompt=S({"return": "x"}), label="queued"))
        await queued.dispose()
        await hog.dispose()

    st = Store(tmp_path / "store", create=False)
    from subagents.store import list_children, list_descendants

    rows = {e.id: e for e in list_children(st, root.id)}
    for child, (outcome, code) in expected.items():
        assert (rows[child].status, rows[child].outcome) == ("complete", outcome), rows[child]
        assert rows[child].error_code == code, rows[child]
    boom = next(i for i, (o, _) in expected.items() if o == "error")
    assert rows[boom].error == "RuntimeError: boom"  # the first line only
    assert "timeout_ms=50" in (next(r for r in rows.values() if r.outcome == "timeout").error or "")
    assert [r.entry.outcome for r in list_descendants(st, sub.id)] == ["drained"]
    never = {e.label: e.outcome for e in list_children(st, root2.id)}
    assert never["queued"] == "not-started"
    assert never["hog"] == "aborted"

    # the CLI: --json rows carry the same outcome; text shows it beside the status
    listing = {r["id"]: r for r in json.loads(cli(str(st.root), "ls", root.id, "--json"))}
    assert {c: (listing[c]["outcome"], listing[c]["error_code"]) for c in expected} == expected
    tree = json.loads(cli(str(st.root), "tree", sub.id, "--json"))
    assert [r["outcome"] for r in tree] == ["drained"]
    text = cli(str(st.root), "ls", root.id)
    header, *lines = text.splitlines()
    assert header.split() == ["ID", "STATUS", "OUTCOME", "MODE", "CREATED", "LABEL", "ERROR"]
    for child, (outcome, _) in expected.items():
        (line,) = [line for line in lines if child.startswith(line.split()[0])]  # a unique prefix of the id
        assert line.split()[1:3] == ["complete", outcome], line
    assert "RuntimeError: boom" in text and "second line" not in text
    tree_text = cli(str(st.root), "tree", root2.id)
    assert "not-started" in tree_text and "aborted" in tree_text


async def test_a_drained_running_child_with_nothing_queued_reads_drained(tmp_path) -> None:
    """A drain that stops a running turn (no queued work) reads ``drained``, not ``aborted``: the
    drain cancels with its own reason. The service's catalog calls take the store's ``Query``."""
    from subagents.store import Query

    async with open_supervisor(tmp_path, pool_size=1) as sup:
        sup.register_provider(Provider(name="cscript", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="drain")
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="cscript", prompt=S({"sleep": 20_000}), label="busy"))
        await wait_until(lambda: turn_started(sup.store, child), what="the child's turn to start")
        await sup.drain([root])
        [entry] = await sup.list_children(root.id)
        assert entry.outcome == "drained"
        assert await sup.list_children(root.id, Query(outcome=frozenset({"aborted"}))) == []
        [row] = await sup.list_descendants(root.id, Query(outcome=frozenset({"drained"})))
        assert row.entry.id == child


async def test_a_user_interrupt_of_a_turn_still_queued_reads_aborted_not_drained(tmp_path) -> None:
    """The user stops a child whose turn waits for a worker: its message is dropped unrun, as a drain
    drops one, but nobody drained anything: the row reads ``aborted``, as for a turn stopped mid-run,
    and the log's ``message/discarded`` says why (``cause``)."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        sup.register_provider(Provider(name="cscript", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="queued")
        hog = await sup.start("script", SubagentRequest(parent=root, prompt=S({"sleep": 20_000}), label="hog"))
        await wait_until(lambda: turn_started(sup.store, hog.id), what="the hog's turn to start")
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="cscript", prompt=S({"return": "never"}), label="waiting"))
        answer = await sup.interrupt(child, authority=UserAuthority(parent_session=root.id))
        assert answer.outcome == "cancelled", answer

        async def settled() -> bool:
            rows = {e.id: e for e in await sup.list_children(root.id)}
            return rows[child].status == "complete" and rows[child].outcome is not None

        await wait_until(settled, what="the interrupted child to settle")
        rows = {e.id: e for e in await sup.list_children(root.id)}
        assert rows[child].outcome == "aborted", rows[child]
        [dropped] = [e for e in inspect(sup.store, child).events if e["type"] == "message/discarded"]
        assert dropped["data"]["cause"] == "user"
        assert not turn_started(sup.store, child)
        await hog.dispose()


async def test_a_damaged_child_keeps_its_place_in_creation_order(tmp_path) -> None:
    """A child whose file no longer reads is listed where its index entry puts it (by its creation
    time), not first with a creation time of 0: `ls PARENT` keeps the order the children were made in."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root(label="order")
        made = []
        for label in ("first", "second", "third"):
            run = await sup.start("script", SubagentRequest(parent=root, prompt=S({"return": label}), label=label))
            await run.result()
            await run.dispose()
            made.append(run.id)
        store_path = str(sup.store.root)
        last = sup.store.session_path(made[-1])
    os.truncate(last, 100)  # cut inside its lease slots: the file no longer reads
    listing = json.loads(cli(store_path, "ls", root.id, "--json"))
    assert [row["id"] for row in listing] == made, listing
    assert listing[-1]["kind"] == "diagnostic"


async def test_a_child_queued_for_a_worker_has_no_outcome_yet(tmp_path) -> None:
    """Waiting for a free worker, a child is ``running`` with no outcome (``-``): it read ``not-started``,
    which says its turn never will (found by a probe). Once its run is given up before it started, it is."""
    async with open_supervisor(tmp_path, pool_size=1, worker_prefetch=0) as sup:
        root = await sup.open_root(label="queue")
        hog = await sup.start("script", SubagentRequest(parent=root, prompt=S({"sleep": 20_000}), label="hog"))
        await wait_until(lambda: turn_started(sup.store, hog.id), what="the hog's turn to start")
        queued = await sup.start("script", SubagentRequest(parent=root, prompt=S({"return": "x"}), label="queued"))
        rows = {e.label: (e.status, e.outcome) for e in await sup.list_children(root.id)}
        assert rows == {"hog": ("running", None), "queued": ("running", None)}
        assert "not-started" not in cli(str(sup.store.root), "ls", root.id)
        await queued.dispose()
        await hog.dispose()
        rows = {e.label: (e.status, e.outcome) for e in await sup.list_children(root.id)}
        assert rows == {"hog": ("complete", "aborted"), "queued": ("complete", "not-started")}


async def test_a_child_drained_with_work_queued_says_what_the_drain_dropped(tmp_path) -> None:
    """Its sibling drained with nothing queued lists ``the turn was cancelled (drain)``; it listed
    ``drained`` with no text at all. Its settled row says the same, and the store checks clean."""
    from subagents.store.check import check_store

    async with open_supervisor(tmp_path, pool_size=2) as sup:
        sup.register_provider(Provider(name="cscript", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="drain")
        busy, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="cscript", prompt=S({"sleep": 20_000}), label="busy"))
        queued, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="cscript", prompt=S({"sleep": 20_000}), label="queued"))
        for child in (busy, queued):
            await wait_until(lambda: turn_started(sup.store, child), what="the turn to start")
        await sup.followup(root, queued, S({"return": "never runs"}))
        await sup.followup(root, queued, S({"return": "nor this"}))
        await sup.drain([root])
        rows = {e.label: (e.outcome, e.error) for e in await sup.list_children(root.id)}
    assert rows == {"busy": ("drained", "the turn was cancelled (drain)"), "queued": ("drained", "2 accepted messages dropped unrun (drain)")}
    assert check_store(Store(tmp_path / "store", create=False)).clean
