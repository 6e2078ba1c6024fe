"""``Supervisor.open`` as a context manager: what comes out of its body (issue 13, API surprises)."""

from __future__ import annotations

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
