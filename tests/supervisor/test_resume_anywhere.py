"""Resume needs no registration: a continuable child's descriptor records its program (issue 13).

A child whose provider named a program by reference (a built-in name or
``module:function``) can be followed up from any supervisor on the store,
after a restart, without registering that provider again. A provider
registered under the child's provider name still takes precedence. A
program carried by value (a Python object) is recorded nowhere, and the
refusal says so.
"""

from __future__ import annotations

import json

import pytest

from subagents.store import Store, read_mailbox, read_projection
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, RegistryError, Supervisor, SupervisorConfig

from ..conftest import helper

pytestmark = pytest.mark.anyio


def S(*actions) -> str:
    return json.dumps({"script": list(actions)})


def config() -> SupervisorConfig:
    return SupervisorConfig(pool_size=1, durability="none")


async def _settled_child(store, provider: Provider, prompt: str) -> tuple[str, str]:
    async with Supervisor.open(store=store, config=config()) as sup:
        sup.register_provider(provider)
        root = await sup.open_root(label="r")
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider=provider.name, prompt=prompt, label="c"))
        await sup.wait_for_message(root, timeout_s=30)
        return root.id, child


@pytest.mark.parametrize("program, prompt, answer", [
    ("script", S({"return": "first"}), "again"),
    (helper("echo_upper"), "first", "AGAIN"),
])
async def test_a_restarted_supervisor_resumes_without_the_provider(tmp_path, program, prompt, answer):
    store = tmp_path / "st"
    root_id, child = await _settled_child(store, Provider(name="custom", program=program, capabilities=Capabilities.all(), continuable=True), prompt)
    assert read_projection(Store(store), child).continuable().program == program
    async with Supervisor.open(store=store, config=config()) as sup:  # nothing registered here
        root = await sup.open_root(id=root_id)
        await sup.followup(root, child, S({"return": "again"}) if program == "script" else "again")
        [notice] = await sup.wait_for_message(root, timeout_s=30)
        assert notice.content.endswith(f"Its closing message:\n{answer}")


async def test_a_registered_provider_of_that_name_takes_precedence(tmp_path):
    store = tmp_path / "st"
    root_id, child = await _settled_child(store, Provider(name="custom", program=helper("echo_upper"), capabilities=Capabilities.all(), continuable=True), "x")
    async with Supervisor.open(store=store, config=config()) as sup:
        sup.register_provider(Provider(name="custom", program="echo", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(id=root_id)
        await sup.followup(root, child, "lower")
        [notice] = await sup.wait_for_message(root, timeout_s=30)
        assert notice.content.endswith("Its closing message:\nlower")


async def test_a_program_carried_by_value_says_why_it_cannot_resume(tmp_path):
    async def by_value(ctx):
        return "done"

    store = tmp_path / "st"
    root_id, child = await _settled_child(store, Provider(name="inline", program=by_value, capabilities=Capabilities.all(), continuable=True), "x")
    async with Supervisor.open(store=store, config=config()) as sup:
        root = await sup.open_root(id=root_id)
        before = len(read_mailbox(sup.store, child))
        with pytest.raises(RegistryError) as caught:
            await sup.followup(root, child, "again")
        assert len(read_mailbox(sup.store, child)) == before  # refused before anything was accepted
        assert sup.continuation.activations == {}
    assert caught.value.code == "NO_PROVIDER"
    assert "carried by value" in str(caught.value)
