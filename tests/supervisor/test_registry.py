"""The provider registry: names, events, rollback, and what unregistering never revokes."""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.supervisor import Capabilities, Provider, RegistryError, SubagentError, SubagentRequest

from ..conftest import DEADLINE_S, disk_snapshot, open_supervisor

pytestmark = pytest.mark.anyio


async def test_duplicate_provider_fails_loudly(tmp_path):
    """A taken name raises DUPLICATE_PROVIDER with the reference's text; the first stays."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        first = Provider(name="spawn", program="echo")
        sup.register_provider(first)
        with pytest.raises(RegistryError) as info:
            sup.register_provider(Provider(name="spawn", program="script"))
        assert info.value.code == "DUPLICATE_PROVIDER"
        assert str(info.value) == 'a subagent provider named "spawn" is already registered'
        assert sup.get_provider("spawn") is first
        assert sup.providers() == ["spawn"]


async def test_no_provider_rejects_start_and_writes_nothing(tmp_path):
    """Starting an unknown provider raises NO_PROVIDER before any child exists."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(SubagentError) as info:
            await sup.start("missing", SubagentRequest(parent=root, prompt="hi"))
        assert info.value.code == "NO_PROVIDER"
        assert str(info.value) == 'no subagent provider registered for "missing"'
        assert disk_snapshot(sup.store) == before


async def test_get_provider_unknown_is_none(tmp_path):
    async with open_supervisor(tmp_path, providers=False) as sup:
        assert sup.get_provider("nope") is None
        assert sup.providers() == []


async def test_providers_keep_insertion_order(tmp_path):
    """``providers()`` lists names in registration order, not sorted; a re-registered name goes last."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        names = ["zeta", "alpha", "mid", "beta"]
        off = {n: sup.register_provider(Provider(name=n, program="echo")) for n in names}
        assert sup.providers() == names
        off["alpha"]()
        assert sup.providers() == ["zeta", "mid", "beta"]
        sup.register_provider(Provider(name="alpha", program="echo"))
        assert sup.providers() == ["zeta", "mid", "beta", "alpha"]


async def test_provider_added_listener_that_raises_rolls_back(tmp_path):
    """provider-added is un-contained: the listener's error propagates and the provider is absent."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        seen: list[tuple[str, dict]] = []

        def explode(name, payload):
            seen.append((name, payload))
            raise RuntimeError("listener refused")

        off = sup.on("subagent/provider-added", explode)
        with pytest.raises(RuntimeError, match="listener refused"):
            sup.register_provider(Provider(name="spawn", program="echo"))
        assert seen == [("subagent/provider-added", {"provider": "spawn"})]
        assert sup.get_provider("spawn") is None
        assert sup.providers() == []
        off()
        sup.register_provider(Provider(name="spawn", program="echo"))  # the name is free again
        assert sup.providers() == ["spawn"]


async def test_provider_events_added_and_removed(tmp_path):
    """Register emits provider-added; the unregister callable emits provider-removed once (idempotent)."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        seen: list[tuple[str, dict]] = []
        sup.on(None, lambda name, payload: seen.append((name, payload)))
        unregister = sup.register_provider(Provider(name="spawn", program="echo"))
        unregister()
        unregister()
        assert seen == [
            ("subagent/provider-added", {"provider": "spawn"}),
            ("subagent/provider-removed", {"provider": "spawn"}),
        ]
        assert sup.get_provider("spawn") is None


async def test_provider_removed_listener_that_raises_is_contained(tmp_path):
    """A throwing provider-removed listener never undoes the removal nor hides other listeners."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        later: list[str] = []
        sup.on("subagent/provider-removed", lambda n, p: (_ for _ in ()).throw(RuntimeError("boom")))
        sup.on("subagent/provider-removed", lambda n, p: later.append(p["provider"]))
        sup.register_provider(Provider(name="spawn", program="echo"))()
        assert sup.get_provider("spawn") is None
        assert later == ["spawn"]


async def test_stale_unregister_does_not_remove_a_newer_provider(tmp_path):
    """The disposer of a removed registration leaves a later provider of the same name alone."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        old = sup.register_provider(Provider(name="spawn", program="echo"))
        old()
        newer = Provider(name="spawn", program="script")
        sup.register_provider(newer)
        old()
        assert sup.get_provider("spawn") is newer


async def test_unregister_does_not_affect_an_accepted_run(tmp_path):
    """A run accepted before unregistering completes; new starts fail; the child stays listed."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        unregister = sup.register_provider(Provider(name="spawn", program="script", capabilities=Capabilities.all()))
        root = await sup.open_root()
        run = await sup.start("spawn", SubagentRequest(parent=root, prompt=json.dumps([{"sleep": 100}, {"return": "done"}]), label="kept"))
        unregister()
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        await run.dispose()
        assert result.stop_reason == "completed"
        assert result.output == "done"
        with pytest.raises(SubagentError) as info:
            await sup.start("spawn", SubagentRequest(parent=root, prompt="again"))
        assert info.value.code == "NO_PROVIDER"
        children = await sup.list_children(root.id)
        assert [(c.id, c.label, c.status) for c in children] == [(run.id, "kept", "complete")]
