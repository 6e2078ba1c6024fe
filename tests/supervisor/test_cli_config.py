"""`subagents config show` says where each value came from: default, file:line, environment variable or flag (issue #15)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from subagents.supervisor.config_loader import dump_toml, load_config

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


# every character a TOML string may not hold as it is, and every other one str.splitlines breaks at
AWKWARD = "".join(chr(c) for c in [*range(1, 0x20), *range(0x7F, 0xA0)]) + "\u2028\u2029\"\\"


def _shown_again(tmp_path: Path, text: str) -> dict:
    """``config show --json`` of ``text`` given as the deployment file: what it reads back as."""
    (tmp_path / "again.toml").write_text(text, encoding="utf-8", newline="")
    again = subprocess.run([*CLI, "--config", "again.toml", "config", "show", "--json"], cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=DEADLINE_S)
    assert again.returncode == 0, again.stderr
    return json.loads(again.stdout)


@pytest.mark.parametrize("store_path", ["st\u2028x", "a\x01b", "\x85\u2029\x1c\x7f", "tab\tnl\ncr\rend", 'q"b\\s'])
def test_config_show_text_reads_back_to_the_same_values_whatever_they_hold(tmp_path: Path, store_path: str) -> None:
    """Found by a probe: a value holding U+2028 was split in two lines (the text no longer parsed), and one holding
    a control character printed it as it is (TOML refuses it). Each is an escape now, on one line."""
    done = subprocess.run([*CLI, "config", "show"], cwd=tmp_path, env={**ENV, "SUBAGENTS_STORE": store_path},
                          capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    assert not set(done.stdout) & (set(AWKWARD[:-2]) - {"\n"}), done.stdout
    assert _shown_again(tmp_path, done.stdout)["store"]["path"] == store_path


def test_config_show_text_reads_back_whatever_the_deployment_file_is_named(tmp_path: Path) -> None:
    """The file's name is in the comments (``# from NAME``, ``# NAME:LINE``), which no control character may be in."""
    name = "deploy\x01\u2028.toml"
    (tmp_path / name).write_text(DEPLOY)
    done = subprocess.run([*CLI, "--config", name, "config", "show"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    assert "\x01" not in done.stdout and "\u2028" not in done.stdout, done.stdout
    assert _shown_again(tmp_path, done.stdout)["supervisor"]["lease_ttl_s"] == 7.5


def test_a_dumped_configuration_loads_back_whatever_its_strings_hold() -> None:
    """Every character that needs an escape, in one value, through ``dump_toml`` and the loader."""
    config = load_config(None, env={"SUBAGENTS_STORE": AWKWARD}).config
    assert tomllib.loads(dump_toml(config))["store"]["path"] == AWKWARD


@pytest.mark.parametrize("layer", ["file", "env"])
def test_a_store_path_beginning_with_a_tilde_is_in_the_home_folder(tmp_path: Path, layer: str) -> None:
    """``path = "~/stores/main"`` made a folder named ``~`` in the working folder (a shell expands ``~``
    in ``--store``, nothing did in a deployment file or a variable), which ``rm -rf ~`` would then
    "clean up" (found by a probe)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "deploy.toml").write_text('[store]\npath = "~/stores/main"\n')
    env = {**ENV, "HOME": str(home), "SUBAGENTS_DURABILITY": "none"}
    args = ["--config", "deploy.toml"] if layer == "file" else []
    if layer == "env":
        env["SUBAGENTS_STORE"] = "~/stores/main"
    done = subprocess.run([*CLI, *args, "config", "show", "--json"], cwd=work, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["store"]["path"] == str(home / "stores" / "main")
    done = subprocess.run([*CLI, *args, "run", "echo", "--prompt", "hi"], cwd=work, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    assert (home / "stores" / "main" / "sessions").is_dir() and not (work / "~").exists()


def test_config_show_lists_the_llm_programs_settings_and_where_each_came_from(tmp_path: Path) -> None:
    """Found by a probe: ``SUBAGENTS_LLM_*`` were read by the llm program where its turns run, and ``config show``
    said nothing of them, so a user could not see which model or endpoint their agents would use."""
    env = {**ENV, "SUBAGENTS_LLM_MODEL": "m-1", "SUBAGENTS_LLM_TIMEOUT_S": "7.5"}
    done = subprocess.run([*CLI, "config", "show", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["llm"]["model"] == "m-1" and doc["llm"]["timeout_s"] == 7.5 and doc["llm"]["base_url"] == "https://api.deepseek.com"
    assert doc["sources"]["llm.model"] == "env SUBAGENTS_LLM_MODEL" and doc["sources"]["llm.base_url"] == "default"
    text = subprocess.run([*CLI, "config", "show"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert text.returncode == 0, text.stderr
    assert '# SUBAGENTS_LLM_MODEL = "m-1"  # env SUBAGENTS_LLM_MODEL' in text.stdout.splitlines()
    assert "# SUBAGENTS_LLM_MAX_STEPS = 32  # default" in text.stdout.splitlines()
    tomllib.loads(text.stdout)  # comments: the text still loads back as a deployment file


def test_a_bad_llm_setting_is_refused_where_the_configuration_loads(tmp_path: Path) -> None:
    """A bad value (``SUBAGENTS_LLM_TIMEOUT_S=soon``) was taken at start and failed every llm turn later; it is a
    configuration error now, as a bad ``SUBAGENTS_POOL_SIZE`` is, naming the variable."""
    from subagents.supervisor.config_loader import ConfigError

    with pytest.raises(ConfigError, match="SUBAGENTS_LLM_TIMEOUT_S must be a finite number of seconds above 0, not 'soon'") as caught:
        load_config(env={"SUBAGENTS_LLM_TIMEOUT_S": "soon"})
    assert caught.value.code == "CONFIG_INVALID"
    done = subprocess.run([*CLI, "config", "show"], cwd=tmp_path, env={**ENV, "SUBAGENTS_LLM_MAX_STEPS": "0"},
                          capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 2 and "CONFIG_INVALID" in done.stderr and "SUBAGENTS_LLM_MAX_STEPS" in done.stderr, (done.returncode, done.stderr)
