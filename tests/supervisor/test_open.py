"""``Supervisor.open`` as a context manager: what comes out of its body (issue 13, API surprises)."""

from __future__ import annotations

import gc
import os

import pytest

from subagents.supervisor import RegistryError, Supervisor, SubagentRequest, SupervisorConfig

pytestmark = pytest.mark.anyio


async def test_an_exception_from_the_body_comes_out_as_itself(tmp_path):
    """A single exception raised in the body is not wrapped in an ExceptionGroup: ``except ValueError`` sees it."""
    with pytest.raises(ValueError, match="^the caller's own$"):
        async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")):
            raise ValueError("the caller's own")


async def test_a_service_error_from_the_body_comes_out_as_itself(tmp_path):
    """The same for the service's own errors: the typed error, with its code."""
    with pytest.raises(RegistryError) as caught:
        async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
            root = await sup.open_root()
            await sup.start("nosuch", SubagentRequest(parent=root, prompt="x"))
    assert caught.value.code == "NO_PROVIDER"


async def test_a_group_raised_by_the_body_stays_a_group(tmp_path):
    """A group the body raised itself is left alone."""
    with pytest.raises(ExceptionGroup):
        async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")):
            raise ExceptionGroup("mine", [ValueError("a"), KeyError("b")])


@pytest.mark.parametrize("store, config, name", [
    (None, None, "store"), (3, None, "store"), (b"st", None, "store"), ("", None, "store"), ("st", {"pool_size": 1}, "config"),
])
async def test_open_with_an_argument_of_the_wrong_type_is_an_invalid_request(tmp_path, monkeypatch, store, config, name):
    """Found by an API probe: ``Supervisor.open(store=None)`` was a bare ``TypeError`` from ``os.fspath``, and a
    dict for ``config`` an ``AttributeError``; both are ``INVALID_REQUEST`` naming the argument, and nothing is made."""
    from subagents.supervisor import SubagentError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SubagentError) as caught:
        async with Supervisor.open(store=store, config=config):
            pass
    assert caught.value.code == "INVALID_REQUEST" and name in caught.value.message
    assert list(tmp_path.iterdir()) == []


async def test_wait_for_message_waits_as_long_as_it_takes_unless_bounded(tmp_path):
    """No hidden 30 s default: ``timeout_s`` is None (wait) unless the caller bounds it (issue 13)."""
    import inspect

    from subagents.supervisor import WaitTimeoutError

    assert inspect.signature(Supervisor.wait_for_message).parameters["timeout_s"].default is None
    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        root = await sup.open_root()
        with pytest.raises(WaitTimeoutError):
            await sup.wait_for_message(root, timeout_s=0.05)


async def test_open_configured_reads_the_layers_the_cli_reads(tmp_path):
    """``open_configured``: the deployment file and ``SUBAGENTS_*`` apply, and configured providers are registered."""
    deployment = tmp_path / "deploy.toml"
    deployment.write_text(
        f'[store]\npath = "{tmp_path / "configured"}"\n\n[supervisor]\npool_size = 1\n\n'
        '[[providers]]\nname = "helper"\nprogram = "echo"\n'
    )
    env = {"SUBAGENTS_DURABILITY": "none"}
    async with Supervisor.open_configured(deployment, env=env) as sup:
        assert sup.config.pool_size == 1 and sup.config.durability == "none"
        assert sup.get_provider("helper") is not None
        root = await sup.open_root(label="configured")
    assert (tmp_path / "configured" / "STORE").exists()
    assert root.id


async def test_open_configured_refuses_a_bad_layer_before_opening(tmp_path):
    from subagents.supervisor.config_loader import ConfigError

    with pytest.raises(ConfigError):
        async with Supervisor.open_configured(env={"SUBAGENTS_POOL_SIZE": "zero", "SUBAGENTS_STORE": str(tmp_path / "st")}):
            pass
    assert not (tmp_path / "st").exists()


async def test_the_configured_record_limit_is_the_new_stores_limit(tmp_path):
    """``max_record_bytes`` reaches the store a supervisor creates: a larger message is refused before it is written."""
    from subagents.store import Store
    from subagents.store.errors import SubagentError
    from subagents.supervisor import Capabilities, ContinuableSpec, Provider

    cfg = SupervisorConfig(pool_size=1, durability="none", max_record_bytes=4096)
    async with Supervisor.open(store=tmp_path / "st", config=cfg) as sup:
        assert Store(tmp_path / "st").max_record_bytes == 4096
        sup.register_provider(Provider(name="echo", program="echo", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        with pytest.raises(SubagentError) as caught:
            await sup.start_continuable(ContinuableSpec(parent=root, provider="echo", label="big", prompt="x" * 10_000))
        assert caught.value.code == "MESSAGE_TOO_LARGE"


async def test_open_root_by_id_refuses_a_child_and_leaves_its_lease(tmp_path):
    """Issue b: ``open_root(id=<a child>)`` was accepted (the child then held as a root at depth 1)."""
    from subagents.store import read_lease

    from subagents.supervisor import InvalidRequestError

    from ..conftest import disk_snapshot, open_supervisor

    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="top")
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="x"))
        await run.result()
        await run.dispose()
        lease_before, before = read_lease(sup.store, run.id), disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as caught:
            await sup.open_root(id=run.id)
        assert caught.value.code == "INVALID_REQUEST"
        assert str(caught.value) == f'session "{run.id}" is not a root: it is a child of "{root.id}"'
        assert read_lease(sup.store, run.id) == lease_before and disk_snapshot(sup.store) == before
        assert sup.agents.get(run.id) is None


async def test_a_reopened_root_reads_its_stored_label(tmp_path):
    """Issue b: a root opened again by id read ``label=None`` instead of the label it was created with."""
    config = SupervisorConfig(pool_size=1, durability="none")
    async with Supervisor.open(store=tmp_path / "st", config=config) as sup:
        root = await sup.open_root(label="main")
    async with Supervisor.open(store=tmp_path / "st", config=config) as sup:
        again = await sup.open_root(id=root.id)
        assert (again.id, again.label) == (root.id, "main")


async def test_open_root_by_id_refuses_another_label(tmp_path):
    """A label given with ``id`` must be the root's own: it is never silently dropped."""
    from subagents.supervisor import InvalidRequestError

    config = SupervisorConfig(pool_size=1, durability="none")
    async with Supervisor.open(store=tmp_path / "st", config=config) as sup:
        root = await sup.open_root(label="main")
    async with Supervisor.open(store=tmp_path / "st", config=config) as sup:
        with pytest.raises(InvalidRequestError) as caught:
            await sup.open_root(id=root.id, label="other")
        assert str(caught.value) == f'root "{root.id}" has "main", not "other"'
        assert (await sup.open_root(id=root.id, label="main")).label == "main"


def _pipes_and_sockets() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own fd, closed meanwhile
        if target.startswith(("pipe:", "socket:")):
            found.add(f"{fd} {target}")
    return found


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
async def test_open_and_close_leave_no_descriptor_behind_without_the_cyclic_gc(tmp_path, start_method):
    """Issue e: each open/close left 2 pipe fds per worker (its process sentinel and start pipe) until the cyclic GC ran."""
    config = SupervisorConfig(pool_size=2, durability="none", start_method=start_method)
    async with Supervisor.open(store=tmp_path / "st", config=config):
        pass  # the first open may start the forkserver, which stays
    gc.collect()
    gc.disable()  # only reference counting frees now: what close leaves open stays visible
    try:
        before = _pipes_and_sockets()
        for _ in range(3):
            async with Supervisor.open(store=tmp_path / "st", config=config):
                pass
        assert _pipes_and_sockets() - before == set()
    finally:
        gc.enable()


def test_open_on_a_store_this_user_may_read_but_not_write_is_store_read_only(tmp_path):
    """Found by a probe run as another user: the open wrote its owner record first and came out as
    ``ExceptionGroup(PermissionError)``; it is ``STORE_READ_ONLY`` before anything is written."""
    import anyio

    from subagents import store as st

    from ..other_user import as_nobody, shared_folder

    async def open_it() -> None:
        async with Supervisor.open(store=path, config=SupervisorConfig(pool_size=1)):
            pass

    with shared_folder() as folder:
        path = os.path.join(folder, "store")
        st.create_session(st.Store(path), st.new_id())
        for sub, _, files in os.walk(path):
            os.chmod(sub, 0o755)
            for name in files:
                os.chmod(os.path.join(sub, name), 0o644)
        before = sorted(os.walk(path))
        outcome = as_nobody(lambda: anyio.run(open_it))
        assert outcome[0] == "error" and outcome[1][:2] == ("ReadOnlyStoreError", "STORE_READ_ONLY"), outcome
        assert sorted(os.walk(path)) == before


async def test_an_idle_wait_for_message_takes_only_when_the_mailbox_moved(tmp_path):
    """Each 20 ms poll took (a log writer opened on the root, its projection read): a probe measured
    2-4% of a core per idle waiter. A poll now reads where the root's mailbox data ends, and takes
    only when an acceptance moved it; a message that arrives is still taken at once."""
    import json

    from subagents.supervisor import Capabilities, ContinuableSpec, Provider, WaitTimeoutError

    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="cont", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        takes = 0
        take = sup.take_messages

        async def counted(which):
            nonlocal takes
            takes += 1
            return await take(which)

        sup.take_messages = counted  # type: ignore[method-assign]  # a count of the real calls, which still run
        with pytest.raises(WaitTimeoutError):
            await sup.wait_for_message(root, timeout_s=0.3)
        assert takes == 1  # the first look, always made
        await sup.start_continuable(ContinuableSpec(parent=root, provider="cont", label="c",
                                                    prompt=json.dumps({"script": [{"sleep": 300}, {"return": "late"}]})))
        takes = 0
        got = await sup.wait_for_message(root, timeout_s=30)
        assert "late" in got[0].content
        assert takes <= 3, takes
