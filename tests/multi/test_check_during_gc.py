"""``check_store`` while a gc in another process collects whole subtrees: clean at every reading.

Found by a probe: a session collected between the check's reading of its log
and of its lease was flagged ``lease-unreadable`` (``SESSION_NOT_FOUND``), one
collected before its mailbox was read had every consumed message flagged
``message-unknown``, and a root whose index entry the gc dropped after the
check read the headers was flagged ``index-missing``. Each is a session that
went, counted ``vanished``.
"""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from subagents.store import check_store
from subagents.supervisor import Capabilities, ContinuableSpec, Provider

from ..conftest import DEADLINE_S, open_supervisor
from ..supervisor.test_cli_control import REPO, cli_env
from ..supervisor.test_continuable import settled_all

ROOTS = 120

GC = """
import sys
from subagents.store import Store, collect
print(len(collect(Store(sys.argv[1], create=False), 0.0).collected), flush=True)
"""


async def _populate(tmp_path) -> str:
    """ROOTS top-level sessions, each with a continuable child that took a message, all settled and let go."""
    async with open_supervisor(tmp_path, pool_size=2, providers=False) as sup:
        sup.register_provider(Provider(name="e", program="echo", capabilities=Capabilities.all(), continuable=True))
        for batch in range(0, ROOTS, 20):
            roots = [await sup.open_root(label=f"r{batch + i}") for i in range(20)]
            children = [(await sup.start_continuable(ContinuableSpec(parent=r, provider="e", prompt="hi", label="c")))[0] for r in roots]
            for root, child in zip(roots, children):
                await settled_all(sup, root, [child])
                await sup.take_messages(root)
        return str(sup.store.root)


def test_readings_taken_while_a_gc_collects_are_clean(tmp_path) -> None:
    store = anyio.run(_populate, tmp_path)
    gc = subprocess.Popen([sys.executable, "-c", GC, store], cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, text=True)
    readings = []
    try:
        while gc.poll() is None:
            report = check_store(store)
            readings.append(report.counts)
            assert report.clean, str(report)
        out, _ = gc.communicate(timeout=DEADLINE_S)
    finally:
        if gc.poll() is None:
            gc.kill()
            gc.communicate(timeout=DEADLINE_S)
    assert gc.returncode == 0 and int(out) > 0
    assert len(readings) >= 2, "the check never overlapped the gc"
    assert check_store(store).clean
