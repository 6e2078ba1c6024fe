"""Status truth across processes: every reader sees what the hosting supervisor sees.

A host process holds one child of each status: a continuable child whose
turn runs (``running``), one that only waits on its own running child
(``idle``), one that settled and a finished one-shot (``complete``), and a
one-shot whose turn still runs. Four other readers list them — a Supervisor
in this process, a Supervisor in another host process, the CLI
(``subagents ls/tree --json``) and a plain reader of the store — and each
reports exactly the same rows. After ``kill -9`` of the host every reader
reports every row ``complete`` at its first look.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import anyio
import pytest

from subagents.store import Store, inspect, list_children, list_descendants
from subagents.supervisor import Supervisor, SupervisorConfig

from ._driver import REPO_ROOT, S, poll

pytestmark = pytest.mark.anyio


def cli(store: str, *args: str) -> object:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env["PYTHONPATH"] = REPO_ROOT
    done = subprocess.run(
        [sys.executable, "-m", "subagents.supervisor.cli", *args, "--json", "--store", store],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def statuses(rows: list[dict]) -> dict[str, str]:
    return {row["id"]: row["status"] for row in rows}


def turn_started(st: Store, session_id: str) -> bool:
    return any(e["type"] == "turn/start" for e in inspect(st, session_id).events)


async def test_every_reader_reports_the_hosts_truth(tmp_path, hosts) -> None:
    """running / idle / complete of children hosted elsewhere, from a Supervisor here, another host,
    the CLI and a plain store reader; after kill -9 of the host, complete everywhere at once."""
    st = Store(tmp_path / "store", durability="none")
    host = hosts.start(st.root, pool_size=3, lease_ttl_s=30.0)  # a long TTL: only the pid check can say "dead"
    root = await host.acall("open_root", label="truth")
    hold = tmp_path / "hold"

    done_child, _ = await host.acall("start_continuable", parent=root, prompt=S({"return": "done"}), label="done")
    await poll(lambda: statuses(_rows(list_children(st, root))).get(done_child) == "complete", what="the quick child to settle")
    done_one_shot = (await host.acall("start", parent=root, prompt="echoed", label="echo"))["child"]

    waiter_turn = S({"start_continuable": {"prompt": S({"gate": str(hold)}, {"return": "g"}), "label": "grandchild"}}, {"return": "w"})
    waiter, _ = await host.acall("start_continuable", parent=root, prompt=waiter_turn, label="waiter", provider="gated")
    runner, _ = await host.acall("start_continuable", parent=root, prompt=S({"gate": str(hold)}, {"return": "r"}), label="runner", provider="gated")
    running_one_shot = (await host.acall("start", parent=root, prompt=S({"gate": str(hold)}, {"return": "o"}), provider="gated", wait=False))["child"]

    def waiting() -> bool:
        rows = statuses(_rows(list_children(st, root)))
        kids = _rows(list_children(st, waiter))
        return rows.get(waiter) == "idle" and len(kids) == 1 and all(turn_started(st, s) for s in (kids[0]["id"], runner, running_one_shot))

    await poll(waiting, what="the waiter to be idle on its running grandchild, and the runner's turn to run")
    grandchild = _rows(list_children(st, waiter))[0]["id"]
    expected = {
        done_child: "complete", done_one_shot: "complete", waiter: "idle", runner: "running", running_one_shot: "running",
    }
    expected_tree = {**expected, grandchild: "running"}

    other = hosts.start(st.root, name="reader")
    async with Supervisor.open(store=st.root, config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        readers = {
            "supervisor here": statuses(_rows(await sup.list_children(root))),
            "another host": statuses(await other.acall("list_children", parent=root)),
            "cli ls": statuses(await anyio.to_thread.run_sync(cli, st.root, "ls", root)),
            "plain reader": statuses(_rows(list_children(Store(st.root, create=False), root))),
        }
        for who, seen in readers.items():
            assert seen == expected, who
        trees = {
            "supervisor here": statuses([_desc(r) for r in await sup.list_descendants(root)]),
            "another host": statuses(await other.acall("list_descendants", root=root)),
            "cli tree": statuses(await anyio.to_thread.run_sync(cli, st.root, "tree", root)),
            "plain reader": statuses([_desc(r) for r in list_descendants(Store(st.root, create=False), root)]),
        }
        for who, seen in trees.items():
            assert seen == expected_tree, who
        depth = {r.entry.id: r.depth for r in await sup.list_descendants(root)}
        assert depth[grandchild] == 2 and depth[waiter] == 1

        killed_at = host.kill()  # SIGKILL and reap: the pid is gone, the heartbeat still fresh (TTL 30 s)
        elapsed = time.monotonic() - killed_at
        after = {
            "supervisor here": statuses([_desc(r) for r in await sup.list_descendants(root)]),
            "another host": statuses(await other.acall("list_descendants", root=root)),
            "cli tree": statuses(await anyio.to_thread.run_sync(cli, st.root, "tree", root)),
            "plain reader": statuses([_desc(r) for r in list_descendants(Store(st.root, create=False), root)]),
        }
        for who, seen in after.items():
            assert seen == {cid: "complete" for cid in expected_tree}, f"{who} ({elapsed * 1000:.0f} ms after the kill)"
        roots = {row["id"]: row for row in (await anyio.to_thread.run_sync(cli, st.root, "ls"))["roots"]}
        assert roots[root]["status"] == "complete"
        # its workers noticed: no process of the dead host remains
        from ._driver import wait_gone

        await anyio.to_thread.run_sync(lambda: wait_gone(host.tag, timeout=10))


def _rows(entries) -> list[dict]:
    import dataclasses

    return [dataclasses.asdict(e) for e in entries]


def _desc(row) -> dict:
    import dataclasses

    return dataclasses.asdict(row.entry)
