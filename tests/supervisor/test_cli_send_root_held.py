"""``subagents send`` takes the root's mail once another process that holds the root for a moment lets go.

Found by a probe: two ``send`` commands at once, to two children of one root, each hosted its child's
turn and printed its settlement notice; each then opens the root to take the notice into the root's
log, and the one that found the root held by the other left its notice there. Nobody reads a root's
mailbox once no command or program holds it: the root listed ``1 pending`` for good, ``gc`` kept its
subtree for that mail, and a later ``take_messages`` handed over a notice already printed. ``send``
now waits a moment (``ROOT_MAIL_WAIT_S``) for the other holder to let go; a root a live program
keeps holding is still left to it, after that wait.

Here the other holder is a real process that holds the root from before the ``send`` until a little
while after the child's notice is durable (or, in the second test, for a minute more).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from subagents.store import Store, mailbox_counts, read_projection
from subagents.supervisor.cli.control import ROOT_MAIL_WAIT_S

from .test_cli_control import REPO, cli, cli_env, script

SETUP = textwrap.dedent(
    """
    import json, sys, anyio
    from subagents.supervisor import *

    async def main(store):
        cfg = SupervisorConfig(pool_size=1, durability="none")
        async with Supervisor.open(store=store, config=cfg) as sup:
            sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
            root = await sup.open_root(label="root")
            first = json.dumps({"script": [{"return": "first"}]})
            child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=first, label="c"))
            while not [m for m in await sup.take_messages(root)]:
                await anyio.sleep(0.02)
            print(json.dumps({"root": root.id, "child": child}), flush=True)

    anyio.run(main, sys.argv[1])
    """
)

# holds the root from before the send until a while after the child's new notice waits in its mailbox
HOLDER = textwrap.dedent(
    """
    import sys, time, anyio
    from subagents.store import Store, read_mailbox
    from subagents.supervisor import *

    async def main(store_path, root, child, hold_s):
        store = Store(store_path, create=False)
        notices = lambda: sum(m.source.get("sender_session_id") == child for m in read_mailbox(store, root))
        before = notices()  # the first turn's, taken already
        async with Supervisor.open(store=store_path, config=SupervisorConfig(pool_size=1, durability="none")) as sup:
            await sup.open_root(id=root)
            print("held", flush=True)
            deadline = time.monotonic() + 60
            while notices() == before:
                assert time.monotonic() < deadline, "no notice came"
                await anyio.sleep(0.01)
            await anyio.sleep(hold_s)

    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
    """
)


def _family(store_path: str) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", SETUP, store_path], capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    ids = json.loads(done.stdout)
    return ids["root"], ids["child"]


def _pending(store_path: str, root: str) -> int | None:
    st = Store(store_path, create=False)
    return mailbox_counts(st, root, read_projection(st, root)).pending


def _send_beside_a_holder(store_path: str, root: str, child: str, hold_s: float) -> tuple[dict, float]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, store_path, root, child, str(hold_s)], stdout=subprocess.PIPE,
                              text=True, env=cli_env(), cwd=REPO)
    try:
        said = holder.stdout.readline()  # type: ignore[union-attr]
        assert said == "held\n", "the other process never held the root"
        started = time.monotonic()
        done = cli(store_path, "send", child, script({"return": "second"}), "--parent", root, "--json")
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), took
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()  # type: ignore[union-attr]


def test_send_takes_the_notice_once_a_brief_holder_of_the_root_lets_go(tmp_path: Path) -> None:
    store_path = str(tmp_path / "st")
    root, child = _family(store_path)
    doc, _took = _send_beside_a_holder(store_path, root, child, hold_s=0.5)
    assert doc["settled"] and doc["notice"] is not None and doc["notice"]["content"].endswith("second"), doc
    assert doc["notice_taken"] is True, doc
    assert _pending(store_path, root) == 0  # nothing left waiting for a reader that never comes


def test_a_root_a_program_keeps_holding_is_left_to_it_after_the_wait(tmp_path: Path) -> None:
    store_path = str(tmp_path / "st")
    root, child = _family(store_path)
    doc, took = _send_beside_a_holder(store_path, root, child, hold_s=60.0)
    assert doc["settled"] and doc["notice"] is not None and doc["notice_taken"] is False, doc
    assert _pending(store_path, root) == 1  # the holder's program reads it
    assert took < 30.0 + ROOT_MAIL_WAIT_S  # it waited a moment, not for the holder
