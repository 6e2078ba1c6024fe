"""Structured logging: records about a child carry child, parent and epoch; --log-json emits them."""

from __future__ import annotations

import json
import logging

import pytest

from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig
from subagents.supervisor.cli.log_format import JsonFormatter as _JsonFormatter, TextFormatter as _TextFormatter


def test_json_and_text_formatters_carry_the_fields() -> None:
    record = logging.LogRecord("subagents.supervisor.continuable.materialization", logging.INFO, __file__, 1, "activation of %s started", ("c1",), None)
    record.child, record.parent, record.epoch = "c1", "r1", 3
    doc = json.loads(_JsonFormatter().format(record))
    assert (doc["message"], doc["child"], doc["parent"], doc["epoch"]) == ("activation of c1 started", "c1", "r1", 3)
    assert _TextFormatter("%(message)s").format(record) == "activation of c1 started [child=c1 parent=r1 epoch=3]"


@pytest.mark.anyio
async def test_activation_records_name_child_parent_and_epoch(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="subagents.supervisor.continuable")
    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="echo", program="echo", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        child_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="echo", prompt="hi", label="e"))
        await sup.wait_for_message(root, timeout_s=20)
    started = [r for r in caplog.records if r.getMessage() == f"activation of {child_id} started"]
    assert [(r.child, r.parent, r.epoch) for r in started] == [(child_id, root.id, 1)]


def test_bound_fields_reach_every_record_of_the_task_and_its_threads(caplog) -> None:
    """bind() in a task: its records, and those of threads it starts, carry child/parent/epoch."""
    import anyio

    from subagents.worker.logcontext import FieldsFilter, bind

    logger = logging.getLogger("subagents.test.bound")
    caplog.set_level(logging.INFO, logger=logger.name)
    caplog.handler.addFilter(FieldsFilter())

    async def task() -> None:
        bind(child="c9", parent="r9", epoch=4)
        logger.info("in the task")
        await anyio.to_thread.run_sync(lambda: logger.info("in a thread"))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(task)
        logger.info("outside")

    anyio.run(main)
    got = {r.getMessage(): (getattr(r, "child", None), getattr(r, "parent", None), getattr(r, "epoch", None)) for r in caplog.records}
    assert got == {"in the task": ("c9", "r9", 4), "in a thread": ("c9", "r9", 4), "outside": (None, None, None)}
