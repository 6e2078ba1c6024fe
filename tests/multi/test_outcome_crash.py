"""A child whose host was killed mid-turn reads ``crashed`` (issue 13 item 2), then ``interrupted`` once repaired.

A host process runs a continuable child and a one-shot child whose turns wait
on a gate that never opens; ``kill -9`` of the host leaves both logs with an
open turn and no live owner. The catalog here and the CLI (``ls --json`` and
text) read ``complete`` / ``crashed`` at once. A cold resume of the
continuable child from this process repairs its log (crash closers), and
then the repaired turn reads ``interrupted`` until a new turn ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from subagents.store import Store, inspect, list_children
from subagents.supervisor import Capabilities, Provider, Supervisor, SupervisorConfig, UserAuthority

from ._driver import REPO_ROOT, S, poll

pytestmark = pytest.mark.anyio


def cli(store: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env["PYTHONPATH"] = REPO_ROOT
    done = subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", store, *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def turn_open(st: Store, session_id: str) -> bool:
    types = [e["type"] for e in inspect(st, session_id).events]
    return "turn/start" in types and "turn/end" not in types


async def test_host_killed_mid_turn_reads_crashed_then_interrupted(tmp_path, hosts) -> None:
    st = Store(tmp_path / "store", durability="none")
    host = hosts.start(st.root, pool_size=2, lease_ttl_s=30.0)  # a long TTL: only the pid check can say "dead"
    root = await host.acall("open_root", label="crash")
    never = str(tmp_path / "never-opened")
    cont, _ = await host.acall("start_continuable", parent=root, prompt=S({"gate": never}), label="cont", provider="gated")
    one = (await host.acall("start", parent=root, prompt=S({"gate": never}), label="one", provider="gated", wait=False))["child"]
    await poll(lambda: turn_open(st, cont) and turn_open(st, one), what="both turns to run")
    assert {e.id: (e.status, e.outcome) for e in list_children(st, root)} == {cont: ("running", None), one: ("running", None)}
    host.kill()

    rows = {e.id: e for e in list_children(st, root)}
    assert {i: (r.status, r.outcome) for i, r in rows.items()} == {cont: ("complete", "crashed"), one: ("complete", "crashed")}
    assert "host stopped mid-turn" in (rows[one].error or "")
    # what happens next differs: a continuable child's turn is closed when it is next resumed; a one-shot is never resumed
    assert rows[cont].error == "its host stopped mid-turn; the turn is closed as interrupted when the child is next resumed"
    assert rows[one].error == "its host stopped mid-turn; a one-shot child is never resumed, so its work ended there"
    listing = {r["id"]: r["outcome"] for r in json.loads(cli(str(st.root), "ls", root, "--json"))}
    assert listing == {cont: "crashed", one: "crashed"}
    assert cli(str(st.root), "ls", root).count(" crashed ") == 2

    # a cold resume repairs the continuable child's log: its first turn is closed as interrupted
    cfg = SupervisorConfig(pool_size=1, durability="none")
    async with Supervisor.open(store=st.root, config=cfg) as sup:
        sup.register_provider(Provider(name="gated", program="tests.multi._driver:gated", capabilities=Capabilities.all(), continuable=True))
        parent = await sup.open_root(id=root)
        await sup.followup(parent, cont, S({"gate": never}))
        await poll(lambda: sum(e["type"] == "turn/start" for e in inspect(st, cont).events) == 2, what="the second turn")
        assert {e.id: e.outcome for e in await sup.list_children(root)}[cont] == "interrupted"  # the last finished turn's
        await sup.interrupt(cont, authority=UserAuthority(parent_session=root))
        await poll(lambda: {e.id: e.status for e in list_children(st, root)}[cont] == "complete", what="the child to settle")
    assert {e.id: e.outcome for e in list_children(st, root)} == {cont: "aborted", one: "crashed"}
