"""A sandbox mode is one the tools know, everywhere one can be given; a misspelt one is refused.

A probe found ``sandbox="readonly"`` (or ``"READ-ONLY"``, ``"bogus"``)
accepted by ``start``, and the child then wrote files: only the exact text
``read-only`` forbids writers, so a typo silently widened the child. Every
entry point refuses an unknown mode with ``INVALID_REQUEST`` before anything
is created.
"""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.supervisor import Capabilities, ContinuableSpec, InvalidRequestError, Provider, SubagentRequest

from subagents.worker.tools import SANDBOX_MODES

from ..conftest import DEADLINE_S, disk_snapshot, last_turn_end, open_supervisor

pytestmark = pytest.mark.anyio

TYPOS = ["readonly", "READ-ONLY", "bogus", ""]


def refusal(mode: str, model: str) -> str:
    return f'invalid {model}: sandbox: unknown sandbox mode "{mode}" (known: read-only, workspace-write, danger-full-access)'


def test_the_known_modes() -> None:
    assert SANDBOX_MODES == ("read-only", "workspace-write", "danger-full-access")


@pytest.mark.parametrize("mode", TYPOS)
def test_a_request_with_an_unknown_mode_is_refused(mode: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SubagentRequest(parent="01P", prompt="x", sandbox=mode)
    assert (info.value.code, str(info.value)) == ("INVALID_REQUEST", refusal(mode, "SubagentRequest"))
    assert info.value.field == "sandbox"
    with pytest.raises(InvalidRequestError) as info:
        ContinuableSpec(parent="01P", provider="script", prompt="x", label="w", sandbox=mode)
    assert str(info.value) == refusal(mode, "ContinuableSpec")


@pytest.mark.parametrize("mode", SANDBOX_MODES)
def test_each_known_mode_is_accepted(mode: str) -> None:
    assert SubagentRequest(parent="01P", prompt="x", sandbox=mode).sandbox == mode
    assert ContinuableSpec(parent="01P", provider="script", prompt="x", label="w", sandbox=mode).sandbox == mode


async def test_open_root_refuses_an_unknown_mode_before_the_root_is_made(tmp_path) -> None:
    async with open_supervisor(tmp_path) as sup:
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            await sup.open_root(label="r", sandbox="readonly")
        assert str(info.value) == 'unknown sandbox mode "readonly" (known: read-only, workspace-write, danger-full-access)'
        with pytest.raises(InvalidRequestError):
            await sup.open_root(sandbox=5)
        assert disk_snapshot(sup.store) == before


@pytest.mark.parametrize("action", ["spawn", "start_continuable"])
async def test_a_program_asking_for_an_unknown_mode_creates_no_child(tmp_path, action: str) -> None:
    """``ctx.spawn``/``ctx.start_continuable`` reach the supervisor as RPCs: the same refusal ends the turn."""
    target = tmp_path / "written.txt"
    inner = [{"tool": "write_file", "args": {"path": str(target), "content": "x"}}]
    args = {"prompt": inner, "provider": "script", "sandbox": "readonly"}
    if action == "start_continuable":
        args["label"] = "w"
    async with open_supervisor(tmp_path) as sup:
        sup.register_provider(Provider(name="cont", program="script", capabilities=Capabilities.all(), continuable=True))
        if action == "start_continuable":
            args["provider"] = "cont"
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps([{action: args}])))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        await run.dispose()
        model = "SubagentRequest" if action == "spawn" else "ContinuableSpec"
        assert result.stop_reason == "error"
        assert result.diagnostic == "INVALID_REQUEST: " + refusal("readonly", model)
        assert last_turn_end(sup.store, run.id)["diagnostic"] == result.diagnostic
        assert await sup.list_children(run.id) == []
        assert not target.exists()


WIDER = [("read-only", "workspace-write"), ("read-only", "danger-full-access"), ("workspace-write", "danger-full-access")]


@pytest.mark.parametrize("parent_mode, asked", WIDER)
async def test_a_child_wider_than_its_parent_is_refused_before_it_is_made(tmp_path, parent_mode: str, asked: str) -> None:
    """A read-only root could start a ``danger-full-access`` child, and a read-only program's child
    wrote files its parent could not: a child's scope is its parent's or narrower. Found by a probe."""
    async with open_supervisor(tmp_path) as sup:
        sup.register_provider(Provider(name="cont", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="r", sandbox=parent_mode)
        before = disk_snapshot(sup.store)
        expected = f'sandbox "{asked}" is wider than its parent\'s "{parent_mode}": a child\'s permission scope cannot be widened'
        with pytest.raises(InvalidRequestError) as info:
            await sup.start("script", SubagentRequest(parent=root, prompt="[]", sandbox=asked))
        assert (str(info.value), info.value.field) == (expected, "sandbox")
        with pytest.raises(InvalidRequestError) as info:
            await sup.start_continuable(ContinuableSpec(parent=root, provider="cont", prompt="[]", label="w", sandbox=asked))
        assert str(info.value) == expected
        assert disk_snapshot(sup.store) == before
        narrower = await sup.start("script", SubagentRequest(parent=root, prompt="[]", sandbox="read-only"))
        assert (await narrower.result()).stop_reason == "completed"
        await narrower.dispose()


async def test_a_read_only_program_cannot_have_a_child_write_for_it(tmp_path) -> None:
    target = tmp_path / "written.txt"
    inner = [{"tool": "write_file", "args": {"path": str(target), "content": "x"}}]
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root(sandbox="read-only")
        prompt = json.dumps([{"spawn": {"prompt": inner, "provider": "script", "sandbox": "danger-full-access"}}])
        run = await sup.start("script", SubagentRequest(parent=root, prompt=prompt))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        await run.dispose()
        assert (result.stop_reason, result.diagnostic) == (
            "error", 'INVALID_REQUEST: sandbox "danger-full-access" is wider than its parent\'s "read-only": '
                     "a child's permission scope cannot be widened")
        assert await sup.list_children(run.id) == []
        assert not target.exists()
