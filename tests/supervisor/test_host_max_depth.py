"""A host-wide cap on delegation depth (``[supervisor] max_depth``), whatever the requests ask.

A request's ``max_depth`` caps only the request that gives it (the reference's rule, kept), so a
program that delegates to itself without one grew without bound: a probe reached 6,800 levels of
sessions. The supervisor's own ``max_depth`` setting is the operator's cap on every child it
creates, by the API or by a program's ``ctx``; it is refused like a request's cap
(``DEPTH_EXCEEDED``, before anything is made), saying which cap refused it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from subagents.store import Store
from subagents.supervisor import SubagentDepthError, SubagentRequest, SupervisorConfig
from subagents.supervisor.config_loader import ConfigError, dump_toml, load_config

from ..conftest import disk_snapshot, open_supervisor

pytestmark = pytest.mark.anyio


def S(*actions: dict) -> str:
    return json.dumps({"script": list(actions)})


async def test_a_child_deeper_than_the_hosts_cap_is_refused_before_it_is_made(tmp_path: Path) -> None:
    async with open_supervisor(tmp_path, max_depth=1) as sup:
        root = await sup.open_root()
        # the child (depth 1) may run; the grandchild it asks for (depth 2) is past the cap
        run = await sup.start("script", SubagentRequest(parent=root, label="child", prompt=S(
            {"spawn": {"prompt": S({"return": "deep"}), "provider": "script", "label": "grandchild"}}, {"return": "made"})))
        result = await run.result()
        assert result.stop_reason == "error"
        assert "DEPTH_EXCEEDED: subagent depth 2 exceeds maxDepth 1 (this supervisor's max_depth setting)" in (result.diagnostic or "")
        assert [row.entry.label for row in await sup.list_descendants(root.id)] == ["child"]


async def test_the_narrower_of_the_request_and_the_host_cap_decides(tmp_path: Path) -> None:
    async with open_supervisor(tmp_path, max_depth=0) as sup:
        root = await sup.open_root()
        before = disk_snapshot(Store(tmp_path / "store", create=False))
        with pytest.raises(SubagentDepthError) as host:
            await sup.start("script", SubagentRequest(parent=root, prompt=S({"return": "x"}), max_depth=5))
        assert (host.value.code, host.value.attempted_depth, host.value.max_depth) == ("DEPTH_EXCEEDED", 1, 0)
        assert str(host.value) == "subagent depth 1 exceeds maxDepth 0 (this supervisor's max_depth setting)"
        assert disk_snapshot(Store(tmp_path / "store", create=False)) == before
    async with open_supervisor(tmp_path, max_depth=5) as sup:
        root = await sup.open_root()
        with pytest.raises(SubagentDepthError) as request:
            await sup.start("script", SubagentRequest(parent=root, prompt=S({"return": "x"}), max_depth=0))
        assert str(request.value) == "subagent depth 1 exceeds maxDepth 0"  # the request's own cap: the reference's text


def test_the_setting_loads_from_a_file_and_the_environment_and_none_lifts_it(tmp_path: Path) -> None:
    assert load_config(env={}).config.supervisor.max_depth is None  # the reference's default: no cap
    assert SupervisorConfig().max_depth is None
    path = tmp_path / "deploy.toml"
    path.write_text("[supervisor]\nmax_depth = 8\n")
    loaded = load_config(path, env={})
    assert loaded.config.supervisor.max_depth == 8
    assert load_config(path, env={"SUBAGENTS_MAX_DEPTH": "3"}).config.supervisor.max_depth == 3
    assert load_config(path, env={"SUBAGENTS_MAX_DEPTH": "none"}).config.supervisor.max_depth is None
    again = tmp_path / "again.toml"
    again.write_text(dump_toml(loaded.config))
    assert load_config(again, env={}).config == loaded.config
    again.write_text(dump_toml(load_config(env={}).config))
    assert load_config(again, env={}).config.supervisor.max_depth is None
    for bad in ("-1", "1.5", "deep"):
        with pytest.raises(ConfigError) as caught:
            load_config(path, env={"SUBAGENTS_MAX_DEPTH": bad})
        assert caught.value.code == "CONFIG_INVALID" and "max_depth" in str(caught.value)
