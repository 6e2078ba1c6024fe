"""A turn waiting on two calls at once frees its worker's slot once, not twice.

A turn blocked in a waiting call (``spawn(wait=True)``, ``wait_run``) is parked: it stops counting
against its worker's ``turns_per_worker``. The worker counted each waiting call, so a turn with two
in flight (a model's two tool calls run at once) freed two slots: with one turn per worker, two
turns handed ahead ran at once beside it.
"""

from __future__ import annotations

import json

import pytest

from subagents.supervisor import Capabilities, Provider, SubagentRequest

from ..conftest import helper, open_supervisor

pytestmark = pytest.mark.anyio


async def test_two_children_waited_on_at_once_run_one_at_a_time_on_one_slot(tmp_path) -> None:
    async with open_supervisor(tmp_path, pool_size=1, providers=False, turns_per_worker=1) as sup:
        caps = Capabilities.all()
        sup.register_provider(Provider(name="two", program=helper("waits_on_two_at_once"), capabilities=caps))
        sup.register_provider(Provider(name="times-itself", program=helper("times_itself"), capabilities=caps))
        root = await sup.open_root(label="main")
        run = await sup.start("two", SubagentRequest(parent=root, prompt="go"))
        result = await run.result()
        await run.dispose()
    assert result.stop_reason == "completed", result
    (first_start, first_end), (second_start, second_end) = sorted(
        tuple(map(float, output.split())) for output in json.loads(result.output))
    assert second_start >= first_end, "the two children ran at once on a worker that takes one turn at a time"
