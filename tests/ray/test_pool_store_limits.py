"""The store's limits on the local and the Ray pool alike: a full disk, and the record size limit.

Found by a probe on Ray: a turn whose output the disk had no room for left its log open (no ``turn/end``),
listed ``crashed`` ("its host stopped mid-turn") with no error code, where the local pool ends it
``error DURABILITY_FAILED``; and an output within 16 bytes of ``max_record_bytes`` ended ``RECORD_TOO_LARGE``
on Ray (its check framed seq and epoch at their widest) and ``completed`` on the local pool.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any

import anyio
import msgpack
import pytest

from subagents.supervisor import Capabilities, Provider, SubagentRequest

from ..conftest import DEADLINE_S, events_of, said, wait_until
from ._pools import open_pool_supervisor
from .conftest import RAY_TESTS

pytestmark = [pytest.mark.anyio, *RAY_TESTS]

PROGRAMS = "tests.ray._limit_programs"


async def log_writer_pid(sup: Any, kind: str, worker_pid: int) -> int:
    """The process that writes a turn's log: its worker on the local pool, the store service on Ray."""
    if kind == "local":
        return worker_pid
    return int((await sup.pool._service.ping.remote())["pid"])


async def test_a_turn_the_disk_has_no_room_for_ends_durability_failed_not_as_a_crash(tmp_path: Path, kind: str) -> None:
    """The log's writer may grow the file by 160 KiB more (``RLIMIT_FSIZE``: the kernel's short write, as on a
    full disk), then the turn says ten 64 KiB messages. On both pools: the two that fit are in the log, the
    turn ends ``error`` ``DURABILITY_FAILED`` with a ``turn/end`` saying so, and it is listed that way."""
    gate = tmp_path / "gate"
    async with open_pool_supervisor(tmp_path, kind, pool_size=1, durability="strict") as sup:
        sup.register_provider(Provider(name="floods", program=f"{PROGRAMS}:says_then_floods", capabilities=Capabilities.all()))
        root = await sup.open_root()
        run = await sup.start("floods", SubagentRequest(parent=root, prompt=str(gate)))
        first = await wait_until(lambda: said(sup.store, run.id), what="the turn's first message")
        pid = await log_writer_pid(sup, kind, int(first[0]))
        before = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (os.path.getsize(sup.store.session_path(run.id)) + 160 * 1024, before[1]))
        try:
            gate.touch()
            with anyio.fail_after(DEADLINE_S):
                result = await run.result()
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, before)
        assert result.stop_reason == "error" and (result.diagnostic or "").startswith("DURABILITY_FAILED: "), result
        events = events_of(sup.store, run.id)
        kinds = [e["type"] for e in events]
        assert kinds.count("turn/start") == 1 and kinds[-1] == "turn/end", kinds
        assert events[-1]["data"]["stop_reason"] == "error" and events[-1]["data"]["diagnostic"].startswith("DURABILITY_FAILED: ")
        assert len(said(sup.store, run.id)) == 3  # the pid, then the two 64 KiB messages that fit
        [row] = [r for r in await sup.list_children(root.id) if r.id == run.id]
        assert (row.outcome, row.error_code) == ("error", "DURABILITY_FAILED"), row
        await run.dispose()


@pytest.mark.parametrize("over", [0, 1])
async def test_an_output_at_the_record_limit_gets_the_same_verdict_on_both_pools(tmp_path: Path, kind: str, over: int) -> None:
    """An output whose closing record is exactly ``max_record_bytes`` completes, one byte more ends
    ``RECORD_TOO_LARGE`` naming the record's real size; on Ray the check was 16 bytes stricter."""
    limit = 65536
    async with open_pool_supervisor(tmp_path, kind, pool_size=1, max_record_bytes=limit) as sup:
        sup.register_provider(Provider(name="sized", program=f"{PROGRAMS}:sized", capabilities=Capabilities.all()))
        root = await sup.open_root()
        probe = await sup.start("sized", SubagentRequest(parent=root, prompt="1"))
        with anyio.fail_after(DEADLINE_S):
            assert (await probe.result()).stop_reason == "completed"
        # the closing message of a turn like the probe's: its seq and epoch, as the store frames it
        closing = [e for e in events_of(sup.store, probe.id) if e["type"] == "assistant/message"][-1]
        base = len(msgpack.packb({**closing, "data": {"text": ""}}, use_bin_type=True))
        length = next(n for n in range(limit - 100, limit)
                      if base + len(msgpack.packb("r" * n)) - len(msgpack.packb("")) == limit + over)
        run = await sup.start("sized", SubagentRequest(parent=root, prompt=str(length)))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        if over == 0:
            assert (result.stop_reason, len(result.output)) == ("completed", length), result.diagnostic
        else:
            assert result.stop_reason == "error", result
            assert (result.diagnostic or "").startswith("RECORD_TOO_LARGE: "), result.diagnostic
            assert f"of {limit + 1} bytes exceeds" in (result.diagnostic or ""), result.diagnostic
        await probe.dispose()
        await run.dispose()
