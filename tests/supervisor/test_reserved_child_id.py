"""A continuable child whose id its caller reserved (``ContinuableSpec.child_id``), used twice at once.

Found by a probe of two hosts and one: the caller knows the id before the
child exists, so a second start of it, or a followup to it, can arrive while
the first start is still writing. Exactly one start wins (the other is
``DUPLICATE_CHILD`` and leaves nothing), and every acknowledged message runs
exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from subagents.store import IdGenerator, check_store
from subagents.supervisor import SubagentError

from ..conftest import DEADLINE_S, events_of
from .test_continuable import S, continuable_supervisor, settled, start

pytestmark = pytest.mark.anyio

ROUNDS = 8


async def test_two_starts_of_one_reserved_id_in_one_host_one_wins(tmp_path: Path) -> None:
    """Was: in about half the pairs neither start succeeded (a bare ``KeyError`` and ``SESSION_EXISTS``),
    yet the child existed, listed running with nobody to run it, and its lease outlived the host."""
    ids = IdGenerator()
    async with continuable_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        for _ in range(ROUNDS):
            child_id = ids.new()
            outcomes: list[str] = []

            async def go() -> None:
                try:
                    await start(sup, root, S({"return": "x"}), child_id=child_id)
                    outcomes.append("ok")
                except SubagentError as exc:
                    outcomes.append(exc.code)

            async with anyio.create_task_group() as tg:
                tg.start_soon(go)
                tg.start_soon(go)
            assert sorted(outcomes) == ["DUPLICATE_CHILD", "ok"], outcomes
            await settled(sup, root, child_id)
            assert [e["type"] for e in events_of(sup.store, child_id)].count("turn/start") == 1
    report = check_store(sup.store)
    assert report.clean, report.violations


async def test_a_followup_while_its_start_writes_runs_once_after_the_prompt(tmp_path: Path) -> None:
    """Was: the followup found no activation, saw the lease its own host had just taken, and took it again:
    the new epoch fenced the start's activation, and neither message ever ran."""
    ids = IdGenerator()
    async with continuable_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        for _ in range(ROUNDS):
            child_id = ids.new()
            acked: list[str] = []

            async def begin() -> None:
                acked.append((await start(sup, root, S({"return": "first"}), child_id=child_id))[1])

            async def follow() -> None:
                with anyio.fail_after(DEADLINE_S):
                    while True:
                        try:
                            acked.append(await sup.followup(root, child_id, S({"return": "next"})))
                            return
                        except SubagentError as exc:
                            if exc.code not in ("SESSION_NOT_FOUND", "NOT_RESUMABLE"):  # not created yet
                                raise
                            await anyio.sleep(0)

            async with anyio.create_task_group() as tg:
                tg.start_soon(begin)
                tg.start_soon(follow)
            with anyio.fail_after(DEADLINE_S):
                while [e["type"] for e in events_of(sup.store, child_id)].count("turn/end") < 2:
                    await anyio.sleep(0.02)
            started = [e["data"]["message_id"] for e in events_of(sup.store, child_id) if e["type"] == "turn/start"]
            assert sorted(started) == sorted(acked) and len(started) == 2, (started, acked)
    report = check_store(sup.store)
    assert report.clean, report.violations


_HOST = textwrap.dedent("""
    import json, sys, anyio
    from subagents import Supervisor, SupervisorConfig, Provider, Capabilities, ContinuableSpec, SubagentError
    async def main():
        async with Supervisor.open(store=sys.argv[1], config=SupervisorConfig(pool_size=1)) as sup:
            sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
            root = await sup.open_root(label="host")
            sys.stdout.write("ready\\n"); sys.stdout.flush()
            sys.stdin.readline()
            prompt = json.dumps({"script": [{"return": "x"}]})
            for child_id in sys.argv[2:]:
                try:
                    await sup.start_continuable(ContinuableSpec(parent=root, provider="script", label="x", child_id=child_id, prompt=prompt))
                    print("ok")
                except SubagentError as exc:
                    print(exc.code, str(exc))
    anyio.run(main)
""")


def test_two_hosts_starting_one_reserved_id_one_wins_the_other_is_a_duplicate(tmp_path: Path) -> None:
    """Was ``SESSION_EXISTS`` (the store's word) for the host that lost the race: the caller's word is
    ``DUPLICATE_CHILD``, whoever made the child first."""
    store = str(tmp_path / "store")
    ids = IdGenerator()
    child_ids = [ids.new() for _ in range(ROUNDS)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    hosts = [subprocess.Popen([sys.executable, "-c", _HOST, store, *child_ids], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    try:
        for host in hosts:
            assert host.stdout is not None and host.stdout.readline() == "ready\n"
        for host in hosts:
            assert host.stdin is not None
            host.stdin.write("go\n")
            host.stdin.flush()
        answers = [host.communicate(timeout=DEADLINE_S)[0].splitlines() for host in hosts]
    finally:
        for host in hosts:
            host.kill()
            host.wait()
    assert all(host.returncode == 0 for host in hosts)
    for first, second in zip(*answers):
        assert sorted([first.split()[0], second.split()[0]]) == ["DUPLICATE_CHILD", "ok"], answers
        loser = first if first != "ok" else second
        assert loser.endswith("already exists"), loser
