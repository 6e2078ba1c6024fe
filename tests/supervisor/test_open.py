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
