"""Tool filter and sandbox: a hidden or forbidden tool ends the run ``error`` with TOOL_DENIED."""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.supervisor import SubagentRequest

from ..conftest import DEADLINE_S, events_of, last_turn_end, open_supervisor

pytestmark = pytest.mark.anyio


async def run_script(sup, actions, parent=None, **request):
    root = parent or await sup.open_root()
    run = await sup.start(request.pop("provider", "script"), SubagentRequest(parent=root, prompt=json.dumps(actions), **request))
    with anyio.fail_after(DEADLINE_S):
        result = await run.result()
    await run.dispose()
    return run, result


async def test_denied_tool_ends_error(tmp_path):
    target = tmp_path / "out.txt"
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_script(
            sup, [{"tool": "write_file", "args": {"path": str(target), "content": "x"}}], tool_filter={"deny": ["write_file"]}
        )
        assert result.stop_reason == "error"
        assert result.diagnostic == 'TOOL_DENIED: tool "write_file" is not available to this agent'
        assert not target.exists()
        assert last_turn_end(sup.store, run.id)["diagnostic"] == result.diagnostic
        assert "tool/call" not in [e["type"] for e in events_of(sup.store, run.id)]


async def test_allow_list_hides_everything_else(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("tool-names", SubagentRequest(parent=root, prompt="", tool_filter={"allow": ["echo", "add"], "deny": ["add"]}))
        result = await run.result()
        await run.dispose()
        assert json.loads(result.output) == ["echo"]
        _, denied = await run_script(sup, [{"tool": "add", "args": {"a": 1, "b": 2}}], parent=root, tool_filter={"allow": ["echo"]})
        assert denied.stop_reason == "error"
        assert denied.diagnostic.startswith("TOOL_DENIED: ")


async def test_no_filter_sees_every_builtin_tool(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("tool-names", SubagentRequest(parent=root, prompt=""))
        result = await run.result()
        await run.dispose()
        assert json.loads(result.output) == ["echo", "add", "read_file", "write_file"]


async def test_allowed_tool_runs_and_is_recorded(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_script(sup, [{"tool": "add", "args": {"a": 2, "b": 3}}], tool_filter={"allow": ["add"]})
        assert (result.stop_reason, result.output) == ("completed", "5")
        calls = [e["data"] for e in events_of(sup.store, run.id) if e["type"] in ("tool/call", "tool/result")]
        assert [c["call_id"] for c in calls][0] == calls[1]["call_id"]
        assert calls[0]["name"] == "add" and calls[0]["args"] == {"a": 2, "b": 3}
        assert calls[1]["is_error"] is False and calls[1]["value"] == 5


async def test_failing_tool_records_an_error_result(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_script(sup, [{"tool": "read_file", "args": {"path": str(tmp_path / "absent")}}])
        assert result.stop_reason == "error"
        assert result.diagnostic.startswith("FileNotFoundError")
        results = [e["data"] for e in events_of(sup.store, run.id) if e["type"] == "tool/result"]
        assert len(results) == 1 and results[0]["is_error"] is True


async def test_read_only_sandbox_forbids_write_file(tmp_path):
    target = tmp_path / "out.txt"
    readable = tmp_path / "in.txt"
    readable.write_text("content")
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_script(
            sup, [{"tool": "write_file", "args": {"path": str(target), "content": "x"}}], sandbox="read-only"
        )
        assert result.stop_reason == "error"
        assert result.diagnostic == 'TOOL_DENIED: tool "write_file" writes, and this agent runs in the read-only sandbox'
        assert not target.exists()
        assert events_of(sup.store, run.id)[0]["type"] == "sandbox/mode"
        assert events_of(sup.store, run.id)[0]["data"] == {"mode": "read-only", "source": "delegation"}
        _, read = await run_script(sup, [{"tool": "read_file", "args": {"path": str(readable)}}], sandbox="read-only")
        assert (read.stop_reason, read.output) == ("completed", "content")


async def test_sandbox_is_inherited_by_grandchildren(tmp_path):
    """A root opened read-only delegates its sandbox: a grandchild cannot write either."""
    target = tmp_path / "out.txt"
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root(sandbox="read-only")
        inner = [{"tool": "write_file", "args": {"path": str(target), "content": "x"}}]
        run, result = await run_script(sup, [{"spawn": {"prompt": inner, "provider": "script"}}], parent=root)
        assert result.stop_reason == "completed"
        [grandchild] = await sup.list_children(run.id)
        assert last_turn_end(sup.store, grandchild.id)["diagnostic"].startswith("TOOL_DENIED: ")
        assert events_of(sup.store, grandchild.id)[0]["data"] == {"mode": "read-only", "source": "delegation"}
        assert not target.exists()
