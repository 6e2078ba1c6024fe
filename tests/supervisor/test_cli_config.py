"""`subagents config show` says where each value came from: default, file:line, environment variable or flag (issue #15)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from subagents.supervisor.config_loader import load_config

DEADLINE_S = 60.0
CLI = [sys.executable, "-m", "subagents.supervisor.cli"]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
DEPLOY = """\
# a deployment file
[supervisor]
durability = "none"

lease_ttl_s = 7.5
"""


def show(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    deploy = tmp_path / "deploy.toml"
    deploy.write_text(DEPLOY)
    return subprocess.run([*CLI, "--config", str(deploy), "--store", "elsewhere", "config", "show", *extra], cwd=tmp_path,
                          env={**ENV, "SUBAGENTS_POOL_SIZE": "3"}, capture_output=True, text=True, timeout=DEADLINE_S)


def test_config_show_json_names_the_source_of_every_value(tmp_path: Path) -> None:
    """--json: the configuration as before, plus `sources`, one entry per value."""
    done = show(tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    deploy = tmp_path / "deploy.toml"
    assert doc["supervisor"]["durability"] == "none" and doc["supervisor"]["pool_size"] == 3 and doc["store"]["path"] == "elsewhere"
    sources = doc["sources"]
    assert sources["supervisor.durability"] == f"{deploy}:3"
    assert sources["supervisor.lease_ttl_s"] == f"{deploy}:5"
    assert sources["supervisor.pool_size"] == "env SUBAGENTS_POOL_SIZE"
    assert sources["store.path"] == "flag --store"
    assert sources["supervisor.start_method"] == "default" and sources["ray.address"] == "default" and sources["providers"] == "default"
    config = {k: v for k, v in doc.items() if k != "sources"}
    expected = set(config["supervisor"]) - {"ray"}
    assert {k.split(".", 1)[1] for k in sources if k.startswith("supervisor.")} == expected


def test_config_show_text_puts_each_source_beside_its_value(tmp_path: Path) -> None:
    """The text form: `key = value  # source` on every line, and it still loads back as a deployment file."""
    done = show(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    deploy = tmp_path / "deploy.toml"
    assert f'durability = "none"  # {deploy}:3' in lines
    assert "pool_size = 3  # env SUBAGENTS_POOL_SIZE" in lines
    assert 'path = "elsewhere"  # flag --store' in lines
    assert 'start_method = "forkserver"  # default' in lines
    tomllib.loads(done.stdout)
    (tmp_path / "again.toml").write_text(done.stdout)
    again = load_config(tmp_path / "again.toml", env={}).config
    assert again.supervisor.durability == "none" and again.supervisor.pool_size == 3 and again.store.path == "elsewhere"
