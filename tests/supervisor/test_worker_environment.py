"""A worker sees the host's environment as it is when that worker starts, whatever the start method.

Found by a probe: the forkserver froze the environment of the first supervisor of a host process, and
every worker it forked afterwards had that one. A second supervisor opened after ``SUBAGENTS_LLM_BASE_URL``
or the key changed sent its ``llm`` children's requests to the old endpoint, without the new key, and
nothing said so. Each test uses a variable name of its own (xdist runs tests side by side in one process
per xdist worker, sharing its forkserver), and ``monkeypatch`` restores the host's environment.
"""

from __future__ import annotations

import uuid

import anyio
import pytest

from subagents.supervisor import Capabilities, Provider, Supervisor, SubagentRequest, SupervisorConfig

from ..conftest import DEADLINE_S, helper

pytestmark = pytest.mark.anyio

METHODS = ["forkserver", "spawn", "fork"]


def _variable() -> str:
    return f"SUBAGENTS_TEST_ENV_{uuid.uuid4().hex.upper()}"


def _config(method: str) -> SupervisorConfig:
    return SupervisorConfig(pool_size=1, start_method=method, durability="none")


def _register(sup: Supervisor) -> None:
    caps = Capabilities.all()
    sup.register_provider(Provider(name="env", program=helper("environment_value"), capabilities=caps))
    sup.register_provider(Provider(name="exit", program=helper("exits_the_worker"), capabilities=caps))


async def _run(sup: Supervisor, root: str, provider: str, prompt: str) -> tuple[str, str]:
    """One child's stop reason and output."""
    run = await sup.start(provider, SubagentRequest(parent=root, prompt=prompt))
    with anyio.fail_after(DEADLINE_S):
        result = await run.result()
    await run.dispose()
    return result.stop_reason, result.output or ""


async def _value(sup: Supervisor, root: str, name: str) -> str:
    """The value of ``name`` a worker of ``sup`` sees (its pid left out)."""
    stop, output = await _run(sup, root, "env", name)
    assert stop == "completed", output
    return output.split(" ", 1)[1]


@pytest.mark.parametrize("method", METHODS)
async def test_a_second_supervisor_s_workers_see_the_environment_it_was_opened_in(tmp_path, monkeypatch, method) -> None:
    name = _variable()
    monkeypatch.setenv(name, "first")
    async with Supervisor.open(store=tmp_path / "store", config=_config(method)) as sup:
        _register(sup)
        assert await _value(sup, await sup.open_root(), name) == "first"
    monkeypatch.setenv(name, "second")
    async with Supervisor.open(store=tmp_path / "store", config=_config(method)) as sup:
        _register(sup)
        assert await _value(sup, await sup.open_root(), name) == "second"
    monkeypatch.delenv(name)
    async with Supervisor.open(store=tmp_path / "store", config=_config(method)) as sup:
        _register(sup)
        assert await _value(sup, await sup.open_root(), name) == "<unset>", "a variable unset in the host is unset in the worker"


@pytest.mark.parametrize("method", METHODS)
async def test_a_replacement_worker_sees_the_environment_of_its_own_start(tmp_path, monkeypatch, method) -> None:
    name = _variable()
    monkeypatch.setenv(name, "at open")
    async with Supervisor.open(store=tmp_path / "store", config=_config(method)) as sup:
        _register(sup)
        root = await sup.open_root()
        assert await _value(sup, root, name) == "at open"
        monkeypatch.setenv(name, "changed")
        assert await _value(sup, root, name) == "at open", "a running worker keeps the environment it started with"
        stop, _ = await _run(sup, root, "exit", "")
        assert stop == "error"
        assert await _value(sup, root, name) == "changed"
