"""Opening a supervisor on either pool, for the tests that hold for both."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from subagents.supervisor import Capabilities, Provider, Supervisor, SupervisorConfig
from subagents.supervisor.config import RayConfig

from ..conftest import all_providers, helper
from .conftest import NAMESPACE

RAY = RayConfig(address="auto", namespace=NAMESPACE)


def ray_providers() -> list[Provider]:
    caps = Capabilities.all()
    return [
        Provider(name="node-pid", program=helper("node_pid"), capabilities=caps, continuable=True),
        Provider(name="node-then-sleep", program=helper("node_then_sleep"), capabilities=caps, continuable=True),
        Provider(name="node-then-hold", program=helper("node_then_hold"), capabilities=caps, continuable=True),
        Provider(name="dies-after-its-commit", program=helper("dies_after_its_commit"), capabilities=caps),
        Provider(name="script-c", program="script", capabilities=caps, continuable=True),
    ]


@asynccontextmanager
async def open_pool_supervisor(tmp_path: Path, kind: str, *, pool_size: int = 1, durability: str = "none", **config: Any) -> AsyncIterator[Supervisor]:
    """A supervisor over ``tmp_path/store`` with the test providers, on the ``local`` or the ``ray`` pool."""
    # a generous start deadline: a loaded 2-core machine runs the cluster's ~15 processes beside the suite,
    # and the CPUs of the previous test's actors are returned to Ray only after they exit
    config.setdefault("worker_ready_timeout_s", 120.0)
    cfg = SupervisorConfig(pool=kind, pool_size=pool_size, durability=durability, ray=RAY, **config)
    async with Supervisor.open(store=tmp_path / "store", config=cfg) as sup:
        for provider in [*all_providers(), *ray_providers()]:
            sup.register_provider(provider)
        yield sup
