"""``Provider`` refuses what it cannot run before anything is made, as the request models do.

A probe found ``Provider(program=123)`` and ``Provider(name=None)`` raising
pydantic's bare ``ValidationError`` (no code), and a malformed program
reference (``"not a ref"``, ``""``, ``"myagents"``) accepted by
``register_provider`` and ``start``: each start then made a child that
ended ``PROGRAM_LOAD_FAILED``, while ``subagents run`` refuses the same text
up front. The shape of a reference is one rule (``reference_problem``), read
by the worker's loader, ``Provider`` and a configured ``[[providers]]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from subagents.supervisor import Capabilities, InvalidRequestError, Provider
from subagents.supervisor.config_loader import ConfigError, load_config

from ..conftest import disk_snapshot, open_supervisor

pytestmark = pytest.mark.anyio

BAD_REFERENCES = ["not a ref", "", "myagents", ":fn", "module:"]


def reference_text(reference: str) -> str:
    return f'program reference "{reference}" is not a built-in name or "package.module:function"'


@pytest.mark.parametrize("fields, message", [
    ({"name": "p", "program": 123}, "invalid Provider: program.str: Input should be a valid string; program.callable: Input should be callable"),
    ({"name": None, "program": "echo"}, "invalid Provider: name: Input should be a valid string"),
    ({"name": "", "program": "echo"}, "invalid Provider: name: String should have at least 1 character"),
    ({"name": "p", "program": "echo", "continuable": "maybe"}, "invalid Provider: continuable: Input should be a valid boolean, unable to interpret input"),
    ({"name": "p", "program": "echo", "capabilities": {"flying": True}}, "invalid Provider: capabilities.flying: Extra inputs are not permitted"),
    ({"name": "p", "program": "echo", "colour": "red"}, "invalid Provider: colour: Extra inputs are not permitted"),
])
def test_a_provider_with_a_wrong_field_is_an_invalid_request(fields, message) -> None:
    with pytest.raises(InvalidRequestError) as info:
        Provider(**fields)
    assert (info.value.code, str(info.value)) == ("INVALID_REQUEST", message)


PROVIDER_NAME_RULE = "a provider's name is printable text of at most 200 characters, with no space at either end"


@pytest.mark.parametrize("name", ["   ", " p", "p\n", "a\nb", "a\x00b", "a\x1b[31mb", "p" * 201])
def test_a_provider_name_no_listing_or_command_could_show_is_refused(name: str) -> None:
    """Found by a probe: names of spaces only, with a newline or a NUL, or 100,000 characters long were
    registered, and then named children in every listing, every ``subagents run NAME`` and every error."""
    with pytest.raises(InvalidRequestError) as info:
        Provider(name=name, program="echo")
    assert str(info.value) == "invalid Provider: name: " + PROVIDER_NAME_RULE
    assert Provider(name="分析-v2.1 fast", program="echo").name == "分析-v2.1 fast"


def test_capabilities_with_a_wrong_field_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError) as info:
        Capabilities(flying=True)
    assert str(info.value) == "invalid Capabilities: flying: Extra inputs are not permitted"


@pytest.mark.parametrize("reference", BAD_REFERENCES)
def test_a_malformed_program_reference_is_refused_at_construction(reference: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        Provider(name="p", program=reference, capabilities=Capabilities.all())
    assert str(info.value) == "invalid Provider: program: " + reference_text(reference)
    assert info.value.field == "program"


@pytest.mark.parametrize("reference", ["echo", "script", "llm", "some.module:fn", "pkg.mod:Holder.method"])
def test_a_well_formed_reference_is_accepted_without_importing_it(reference: str) -> None:
    """Only the shape is checked here: the module may be importable only on the worker's host."""
    assert Provider(name="p", program=reference).program == reference


async def test_register_provider_refuses_what_is_not_a_provider(tmp_path: Path) -> None:
    async with open_supervisor(tmp_path, providers=False) as sup:
        before = disk_snapshot(sup.store)
        with pytest.raises(InvalidRequestError) as info:
            sup.register_provider(None)  # type: ignore[arg-type]
        assert str(info.value) == "provider must be Provider, not NoneType"
        assert sup.providers() == []
        assert disk_snapshot(sup.store) == before


def test_a_configured_provider_with_a_malformed_reference_is_config_invalid(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[[providers]]\nname = 'a'\nprogram = 'not a ref'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.code == "CONFIG_INVALID"
    assert info.value.message.startswith('invalid value for "providers[0].program" in ')
    assert info.value.message.endswith(": " + reference_text("not a ref"))


def test_the_cli_refuses_the_same_reference_with_the_same_text(tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}, "SUBAGENTS_DURABILITY": "none"}
    done = subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "run", "myagents"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: PROGRAM_LOAD_FAILED: " + reference_text("myagents")


def test_a_configured_provider_name_follows_the_same_rule(tmp_path: Path) -> None:
    """A ``[[providers]]`` table is held to the rule ``Provider`` applies: ``CONFIG_INVALID`` at load."""
    config = tmp_path / "subagents.toml"
    config.write_text('[[providers]]\nname = "two\\nlines"\nprogram = "echo"\n')
    with pytest.raises(ConfigError) as info:
        load_config(config, env={})
    assert info.value.code == "CONFIG_INVALID" and PROVIDER_NAME_RULE in str(info.value), info.value
