"""A host that runs out of file descriptors for a while loses no settlement notice and no lease.

Found by a probe: a host whose open-file limit was nearly used up (an application's own sockets) settled
children whose notices never reached their parent ("settlement notice was not delivered ...
SESSION_UNAVAILABLE ... Too many open files"), and left leases held ("lease-expired" in ``store check``).
A store error that says the process had no descriptor left is waited out (briefly, with backoff) where
a settled child's last steps need the store: its lease's release and its notice.
"""

from __future__ import annotations

import os
import resource

import anyio
import pytest

from subagents.store import check_store, read_lease

from .test_continuable import S, continuable_supervisor, settled, start

pytestmark = pytest.mark.anyio


class Exhaustion:
    """Every descriptor of this process taken (under a soft limit lowered for it), until ``release``."""

    def __init__(self) -> None:
        self.soft, self.hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.held: list[int] = []

    def take(self) -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(self.soft, 1024), self.hard))
        try:
            while True:
                self.held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass

    def release(self) -> None:
        for fd in self.held:
            os.close(fd)
        self.held.clear()
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.soft, self.hard))


async def test_a_child_settling_while_its_host_has_no_descriptor_left_still_notifies_and_releases(tmp_path) -> None:
    gate = tmp_path / "gate"
    exhaustion = Exhaustion()
    try:
        async with continuable_supervisor(tmp_path, pool_size=1) as sup:
            root = await sup.open_root(label="main")
            child, _ = await start(sup, root, S({"hold": str(gate)}, {"return": "done"}))
            ready = tmp_path / "ready"
            ready.touch()
            await anyio.sleep(0.5)  # its turn runs, held
            exhaustion.take()
            os.rename(ready, gate)  # no descriptor needed: the worker (its own) ends the turn, the host has none left
            await anyio.sleep(1.0)
            exhaustion.release()
            notice, _ = await settled(sup, root, child)
            assert "finished" in notice.content, notice.content
            assert read_lease(sup.store, child).state == "released"
    finally:
        exhaustion.release()
    report = check_store(sup.store.root)
    assert report.clean, str(report)
