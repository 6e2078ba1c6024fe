"""The store's settings read without the configuration's models agree with the models', and stand aside otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from subagents.supervisor.config_loader import ConfigError, load_config
from subagents.supervisor.config_plain import plain_store

SCRIPT = shutil.which("subagents", path=os.path.dirname(sys.executable)) or shutil.which("subagents")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}


@pytest.mark.parametrize("environ, flag", [
    ({}, None),
    ({"HOME": "/home/someone", "PATH": "/bin"}, None),
    ({"SUBAGENTS_STORE": "/srv/agents"}, None),
    ({"SUBAGENTS_STORE": "~/agents"}, None),
    ({}, "relative/store"),
    ({"SUBAGENTS_STORE": "/srv/agents"}, "~/flagged"),
])
def test_the_plain_reading_agrees_with_the_models(environ: dict[str, str], flag: str | None) -> None:
    loaded = load_config(env=environ).config
    config = loaded.with_store(flag) if flag else loaded
    plain = plain_store(None, flag, environ)
    assert plain is not None
    assert (plain.path, plain.durability) == (config.store.path, config.supervisor.durability)


@pytest.mark.parametrize("config_path, environ, flag", [
    ("deploy.toml", {}, None),
    (None, {"SUBAGENTS_CONFIG": "deploy.toml"}, None),
    (None, {"SUBAGENTS_CONFIG": ""}, None),
    (None, {"SUBAGENTS_DURABILITY": "strict"}, None),
    (None, {"SUBAGENTS_POOL_SIZE": "many"}, None),
    (None, {"SUBAGENTS_LLM_MODEL": "m"}, None),
    (None, {"SUBAGENTS_STORE": ""}, None),
    (None, {"SUBAGENTS_STORE": "a\0b"}, None),
    (None, {}, ""),
])
def test_the_plain_reading_stands_aside_for_anything_but_defaults_and_the_stores_path(
        config_path: str | None, environ: dict[str, str], flag: str | None) -> None:
    """Whatever the models might refuse, or set otherwise, is theirs to read: a bad value keeps its error."""
    assert plain_store(config_path, flag, environ) is None


@pytest.mark.skipif(SCRIPT is None, reason="needs the installed script")
@pytest.mark.parametrize("broken, message", [
    ({"SUBAGENTS_STORE": ""},
     'error: CONFIG_INVALID: invalid value for "store.path" in environment variable SUBAGENTS_STORE: must name a folder, not be empty'),
    ({"SUBAGENTS_DURABILITY": "sometimes"},
     "error: CONFIG_INVALID: invalid value for \"supervisor.durability\" in environment variable SUBAGENTS_DURABILITY: "
     "Input should be 'strict', 'batched' or 'none'"),
])
def test_ls_and_show_beside_a_bad_setting_say_the_models_error(tmp_path: Path, broken: dict[str, str], message: str) -> None:
    for argv in (["ls"], ["show", "01M99D6B3F7Q38019NC9BZEAZG"]):
        done = subprocess.run([SCRIPT, *argv], cwd=tmp_path, env={**ENV, **broken}, capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stderr.strip()) == (2, message)
    with pytest.raises(ConfigError):
        load_config(env=broken)
