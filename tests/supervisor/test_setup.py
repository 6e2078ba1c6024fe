"""register_continuable_setup: install / revoke semantics (the reference's rules; docs/behaviour.md, "Continuable setup")."""

from __future__ import annotations

import json
import os

import anyio
import pytest

from subagents.store import inspect
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


class _Own(BaseException):
    """A host hook's own ``BaseException``: not an ``Exception``, not ``KeyboardInterrupt`` or ``SystemExit``."""


async def test_a_hooks_own_base_exception_is_isolated_like_an_exception(tmp_path) -> None:
    """Found by a probe: a disposer raising its own ``BaseException`` ended the supervisor's task group (every
    disposer is attempted, and failures aggregate into ``ACTIVATION_SETUP_RELEASE_FAILED``, for an ``Exception``
    only); an installer raising one under a child's ``ctx.start_continuable`` did the same. Both are isolated:
    the settlement notice still comes, the child's request fails ``RPC_FAILED``, the supervisor goes on."""
    released: list[str] = []

    def disposer_raises(info: ActivationInfo):
        def dispose():
            released.append(info.label)
            raise _Own("disposer failed")
        return dispose

    async with _open(tmp_path) as sup:
        _provider(sup)
        revoke = sup.register_continuable_setup(disposer_raises)
        root = await sup.open_root()
        child_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=QUICK, label="w"))
        await _settled(sup, root, child_id)
        assert released == ["w"]
        revoke()

        def installer_raises(info: ActivationInfo):
            if info.label == "inner":
                raise _Own("installer failed")

        sup.register_continuable_setup(installer_raises)
        asks = json.dumps({"script": [{"start_continuable": {"prompt": QUICK, "label": "inner", "provider": "script"}}]})
        parent_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=asks, label="outer"))
        await _settled(sup, root, parent_id)
        ends = [e["data"] for e in inspect(sup.store, parent_id).events if e["type"] == "turn/end"]
        assert ends[-1]["stop_reason"] == "error" and "RPC_FAILED" in ends[-1]["diagnostic"], ends
        assert "installer failed" in ends[-1]["diagnostic"], ends
        again, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=QUICK, label="after"))
        await _settled(sup, root, again)


async def test_an_installer_failing_at_a_resume_for_a_message_left_behind_is_logged_not_fatal(tmp_path, monkeypatch) -> None:
    """A message another process accepts while an activation settles is run by a resume the supervisor starts
    on its own (``resume_for_pending``). An installer failing there raised out of that background task and
    ended the supervisor; it is logged, the message stays pending for the next activation, and the
    supervisor goes on. The other process's acceptance is made in exactly that window (before the release)."""
    from subagents.store import IdGenerator, accept
    from subagents.supervisor.continuable import teardown

    def refuses_resumes(info: ActivationInfo):
        if info.resumed:
            raise RuntimeError("no resumes today")

    release = teardown.release_lease
    left: list[str] = []

    def release_after_a_message_arrives(store, child_id, *args):
        if not left:
            left.append(accept(store, child_id, source={"kind": "user"}, content=QUICK, ids=IdGenerator()))
        return release(store, child_id, *args)

    async with _open(tmp_path) as sup:
        _provider(sup)
        sup.register_continuable_setup(refuses_resumes)
        root = await sup.open_root()
        monkeypatch.setattr(teardown, "release_lease", release_after_a_message_arrives)
        child_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=QUICK, label="w"))
        await _settled(sup, root, child_id)
        monkeypatch.setattr(teardown, "release_lease", release)
        await anyio.sleep(0.5)  # the resume for the message left behind has run (and failed) by now
        assert left and left[0] in [m.id for m in pending_of(sup, child_id)]
        other, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=QUICK, label="after"))
        await _settled(sup, root, other)


def pending_of(sup: Supervisor, child_id: str):
    from subagents.store import pending, read_projection

    projection = read_projection(sup.store, child_id)
    return pending(sup.store, child_id, consumed=projection.consumed, last_consumed_id=projection.last_message_id)
