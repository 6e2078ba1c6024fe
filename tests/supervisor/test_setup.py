"""register_continuable_setup: install / revoke semantics (the reference's rules; docs/behaviour.md, "Continuable setup")."""

from __future__ import annotations

import json
import os

import anyio
import pytest

from subagents.store.errors import SubagentError
from subagents.supervisor import ActivationInfo, Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig

pytestmark = pytest.mark.anyio

QUICK = json.dumps({"script": [{"return": "done"}]})


def _open(tmp_path):
    return Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none"))


def _provider(sup: Supervisor) -> None:
    sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))


async def _settled(sup: Supervisor, root, child_id: str) -> None:
    with anyio.fail_after(20):
        while True:
            for message in await sup.wait_for_message(root, timeout_s=20):
                if message.source.get("kind") == "subagent-settled" and message.source.get("sender_session_id") == child_id:
                    return


async def test_contributions_install_in_order_and_release_at_disposal(tmp_path) -> None:
    """Each activation gets every contribution, in registration order; its disposers run when it settles."""
    calls: list[str] = []

    def first(info: ActivationInfo):
        calls.append(f"install first {info.label} resumed={info.resumed}")
        return lambda: calls.append("release first")

    def second(info: ActivationInfo):
        calls.append(f"install second epoch={info.epoch}")
        return lambda: calls.append("release second")

    async with _open(tmp_path) as sup:
        _provider(sup)
        sup.register_continuable_setup(first)
        sup.register_continuable_setup(second)
        root = await sup.open_root()
        child_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=QUICK, label="w"))
        await _settled(sup, root, child_id)
        assert calls == ["install first w resumed=False", "install second epoch=1", "release second", "release first"]
        calls.clear()
        await sup.followup(root, child_id, QUICK)  # a cold resume: a new activation, the contributions again
        await _settled(sup, root, child_id)
        assert calls == ["install first w resumed=True", "install second epoch=2", "release second", "release first"]


async def test_a_failing_installer_releases_the_batch_and_establishes_nothing(tmp_path) -> None:
    calls: list[str] = []

    def good(info: ActivationInfo):
        return lambda: calls.append("released good")

    def bad(info: ActivationInfo):
        raise RuntimeError("no room for this child")

    async with _open(tmp_path) as sup:
        _provider(sup)
        sup.register_continuable_setup(good)
        sup.register_continuable_setup(bad)
        root = await sup.open_root()
        before = set(os.listdir(sup.store.sessions_dir))
        with pytest.raises(RuntimeError, match="no room"):
            await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=QUICK, label="w"))
        assert calls == ["released good"]
        assert set(os.listdir(sup.store.sessions_dir)) == before
        assert await sup.list_children(root.id) == []


async def test_revocation_during_build_is_activation_setup_revoked(tmp_path) -> None:
    """A contribution revoked while the child is built (here by its own installer) fails publication."""
    revokers: list = []
    calls: list[str] = []

    def self_revoking(info: ActivationInfo):
        revokers[0]()
        return lambda: calls.append("released")

    async with _open(tmp_path) as sup:
        _provider(sup)
        revokers.append(sup.register_continuable_setup(self_revoking))
        root = await sup.open_root()
        with pytest.raises(SubagentError) as caught:
            await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=QUICK, label="w"))
        assert caught.value.code == "ACTIVATION_SETUP_REVOKED"
        assert str(caught.value) == (
            "a continuable-subagent setup contribution was revoked while this child was being built; the child was not established"
        )
        assert calls == ["released"]
        assert await sup.list_children(root.id) == []


async def test_revoking_releases_resident_installations_at_once_and_reaches_only_new_activations(tmp_path) -> None:
    calls: list[str] = []
    sleeper = json.dumps({"script": [{"sleep": 60000}]})

    async with _open(tmp_path) as sup:
        _provider(sup)
        revoke = sup.register_continuable_setup(lambda info: (lambda: calls.append(f"released {info.label}")))
        root = await sup.open_root()
        await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=sleeper, label="a"))
        revoke()
        assert calls == ["released a"]  # at once, while "a" is still resident
        revoke()  # idempotent
        late: list[str] = []
        sup.register_continuable_setup(lambda info: late.append(info.label))
        await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=sleeper, label="b"))
        assert late == ["b"]
        await sup.drain([root])
        assert calls == ["released a"]  # disposal does not release it twice
