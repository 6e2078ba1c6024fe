"""A parallel stress test of your own agents, with the kit of ``subagents.testing``.

    pytest -n 4 examples/test_parallel_stress.py

Four xdist workers (one lane each) share ONE store, ``shared_subagents_store``.
Each lane opens its own Supervisor on it and starts 50 one-shot children at once,
while ``subagents_chaos`` kills (SIGKILL) or stops (SIGSTOP, then SIGCONT) that
supervisor's worker processes at random, seeded times. A child whose worker was
killed ends ``error``; every other one ``completed``. Each lane ends with
``check_store``, which must find the store clean although the other lanes may
still be writing to it. A failure prints the chaos seed; rerun with
``--subagents-chaos-seed=SEED`` to replay the same draws.

``STRESS_CHILDREN`` and ``STRESS_LANES`` shrink it (the project's CI runs it small).
"""

from __future__ import annotations

import json
import os

import anyio
import pytest

from subagents import Capabilities, Provider, SubagentRequest, Supervisor, SupervisorConfig
from subagents.testing import check_store, workers_of

CHILDREN = int(os.environ.get("STRESS_CHILDREN", "50"))
LANES = int(os.environ.get("STRESS_LANES", "4"))


def script(*actions: dict) -> str:
    """A message for the built-in ``script`` program: no model needed."""
    return json.dumps({"script": list(actions)})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize("lane", range(LANES))
async def test_children_under_random_kills(lane: int, shared_subagents_store, subagents_chaos) -> None:
    config = SupervisorConfig(pool_size=2, durability="batched")
    async with Supervisor.open(store=shared_subagents_store, config=config) as sup:
        sup.register_provider(Provider(name="work", program="script", capabilities=Capabilities.all()))
        root = await sup.open_root(label=f"lane-{lane}")
        outcomes: list[str] = []

        async def child(i: int) -> None:
            prompt = script({"cpu_iters": 200_000}, {"say": f"child {i} of lane {lane}"}, {"return": "ok"})
            run = await sup.start("work", SubagentRequest(parent=root, prompt=prompt, label=f"child-{i}"))
            outcomes.append((await run.result()).stop_reason)
            await run.dispose()

        with subagents_chaos({"worker": workers_of(sup)}, interval_s=(0.05, 0.3)):
            async with anyio.create_task_group() as tg:
                for i in range(CHILDREN):
                    tg.start_soon(child, i)

        assert len(outcomes) == CHILDREN
        assert set(outcomes) <= {"completed", "error"}, outcomes
        assert len(await sup.list_children(root.id)) == CHILDREN

    report = check_store(shared_subagents_store)
    assert report.clean, str(report)
