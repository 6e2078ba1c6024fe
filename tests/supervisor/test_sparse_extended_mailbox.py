"""A message to a settled continuable child, and a root's take, whose mailbox was extended sparsely, in bounded memory.

``f.seek(1 << 30); f.write(b"x")`` on a mailbox makes a file of 1 GiB that takes a few KiB on
disk. ``followup`` and ``send`` read the child's mailbox before its lease (the messages its log
consumed, then the rest), and a root's ``take_messages`` (``wait_for_message``) reads its pending
messages: each read the whole region up to the stray byte into memory, again under the lock (GiBs
of RSS). The verdict stays the format's (FORMAT.md §3.3, §8): damage that is no torn tail, so
``CORRUPT_SESSION``, nothing written. The calls run in a child process that reports the growth of
its own peak RSS (``VmHWM``) across them alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..store._support import REPO_ROOT, child_env
from .test_continuable import S, continuable_supervisor, settled, start

pytestmark = pytest.mark.anyio

EXTENDED = 1 << 30
BOUND_KIB = 48 << 10  # as tests/store/test_sparse_extended_log.py: a few MiB past one record of the limit

SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import anyio
    from subagents.supervisor import SubagentError
    from tests.supervisor.test_continuable import S, continuable_supervisor

    def peak():  # this process's own peak RSS (KiB)
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

    async def code_of(call):
        try:
            await call()
            return "ok"
        except SubagentError as exc:
            return exc.code

    async def main(tmp, root_id, child_id):
        async with continuable_supervisor(Path(tmp)) as sup:
            root = await sup.open_root(id=root_id)
            before = peak()
            result = [
                await code_of(lambda: sup.followup(root, child_id, S({"return": "never"}))),
                await code_of(lambda: sup.send(child_id, S({"return": "never"}), parent=root.id)),
                await code_of(lambda: sup.take_messages(root)),
                await code_of(lambda: sup.wait_for_message(root, timeout_s=0)),
            ]
            grown = peak() - before
        print(json.dumps({"grown_kib": grown, "result": result}))

    anyio.run(main, *sys.argv[1:])
""")


async def test_followup_send_and_a_roots_take_refuse_extended_mailboxes_in_bounded_memory(tmp_path: Path) -> None:
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"return": "first"}))
        await settled(sup, root, child_id)  # the root took the notice: nothing pending in either mailbox
        paths = [sup.store.path(child_id, "mailbox"), sup.store.path(root.id, "mailbox")]
    for path in paths:
        with open(path, "r+b") as handle:
            handle.seek(EXTENDED)
            handle.write(b"x")
    before = [Path(p).read_bytes()[:1 << 16] for p in paths]
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), root.id, child_id], capture_output=True, text=True,
                          timeout=300, env=child_env(), cwd=str(REPO_ROOT))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["grown_kib"] < BOUND_KIB, f"peak RSS grew by {found['grown_kib'] >> 10} MiB"
    assert found["result"] == ["CORRUPT_SESSION"] * 4
    assert [os.path.getsize(p) for p in paths] == [EXTENDED + 1] * 2
    assert [Path(p).read_bytes()[:1 << 16] for p in paths] == before
