"""A label too large for the store's record limit is ``LABEL_TOO_LARGE``, up front, and nothing is made.

Found by a probe: a child's label past ``max_record_bytes`` failed the start with ``RECORD_TOO_LARGE: a
"subagent/descriptor" event of ...``, naming an event the caller never wrote; a root's said ``a session
header of ...``; and ``subagents run --label`` left the root it had made for the child behind. Each start
path (one-shot, continuable, a root, a program's own ``spawn`` and ``start_continuable``, the CLI's ``run``)
now refuses the label itself, naming its size and the limit, before anything is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from subagents.store import Store, SubagentError, check_store, list_children
from subagents.supervisor import Capabilities, ContinuableSpec, InvalidRequestError, Provider, SubagentRequest, Supervisor, SupervisorConfig

from ..conftest import disk_snapshot
from .test_cli_mistakes import cli, refused

pytestmark = pytest.mark.anyio

LIMIT = 4096
HUGE = "L" * (2 * LIMIT)
SAYS = f"label of {2 * LIMIT} bytes is too large for the store's record size limit of {LIMIT} bytes (max_record_bytes)"


def _config() -> SupervisorConfig:
    return SupervisorConfig(pool_size=1, durability="none", max_record_bytes=LIMIT)


async def test_a_start_with_a_label_too_large_is_refused_and_makes_nothing(tmp_path) -> None:
    async with Supervisor.open(store=tmp_path / "st", config=_config()) as sup:
        sup.register_provider(Provider(name="s", program="script", capabilities=Capabilities.all()))
        sup.register_provider(Provider(name="e", program="echo", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        refusals: list[SubagentError] = []
        for start in (lambda: sup.start("s", SubagentRequest(parent=root, prompt="hi", label=HUGE)),
                      lambda: sup.start_continuable(ContinuableSpec(parent=root, provider="e", label=HUGE, prompt="hi")),
                      lambda: sup.open_root(label=HUGE)):
            with pytest.raises(InvalidRequestError) as caught:
                await start()
            refusals.append(caught.value)
        assert [(r.code, str(r), r.fields["field"], r.fields["limit"]) for r in refusals] == [("LABEL_TOO_LARGE", SAYS, "label", LIMIT)] * 3
        assert disk_snapshot(sup.store) == before
        assert list_children(sup.store, root.id) == []
        assert check_store(sup.store).clean


async def test_a_programs_own_starts_with_a_label_too_large_are_refused(tmp_path) -> None:
    """What a program (the ``llm`` program's delegation tool among them) is answered: the same code and text."""
    async with Supervisor.open(store=tmp_path / "st", config=_config()) as sup:
        sup.register_provider(Provider(name="p", program="tests.programs_for_tests:starts_children_with_a_label_of",
                                       capabilities=Capabilities.all()))
        sup.register_provider(Provider(name="e", program="echo", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        run = await sup.start("p", SubagentRequest(parent=root, prompt=json.dumps({"bytes": 2 * LIMIT, "provider": "e"})))
        result = await run.result()
        await run.dispose()
        assert (result.stop_reason, result.output) == ("completed", "\n".join([f"LABEL_TOO_LARGE: {SAYS}"] * 2)), result
        assert list_children(sup.store, run.id) == []
        assert check_store(sup.store).clean


def test_run_with_a_label_too_large_is_refused_before_its_root_is_made(tmp_path: Path) -> None:
    Store(tmp_path / "st", durability="none", max_record_bytes=LIMIT)  # kept in the store's marker
    done = cli("--store", "st", "run", "echo", "--prompt", "hi", "--label", HUGE, cwd=tmp_path)
    assert refused(done, "LABEL_TOO_LARGE") == SAYS
    assert os.listdir(tmp_path / "st" / "sessions") == []
