"""Bad input found by a black-box probe of the CLI: each case hung, ate memory or printed a traceback.

Each is refused now in one line with its code, before anything is written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from subagents.supervisor.config_loader import ConfigError, load_config

from .test_cli import FAST, cli
from .test_cli_mistakes import refused


def test_a_prompt_from_an_endless_stdin_is_refused_at_the_formats_ceiling(tmp_path: Path) -> None:
    """``--prompt -`` read all of stdin before anything looked at its size: ``< /dev/zero`` took 10 GB in
    30 s and never ended. Stdin is read up to the largest record any store accepts, and no further."""
    with open("/dev/zero", "rb") as endless:
        done = subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "run", "echo", "--prompt", "-"],
                              cwd=tmp_path, env=FAST, stdin=endless, capture_output=True, text=True, timeout=60)
    assert "stdin" in refused(done, "RECORD_TOO_LARGE")
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("kind", ["device", "folder"])
def test_a_config_that_is_no_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """``--config /dev/zero`` was read until memory ran out."""
    path = {"device": Path("/dev/zero"), "folder": tmp_path}[kind]
    with pytest.raises(ConfigError, match="not a regular file or a pipe"):
        load_config(path, env={})


def test_a_config_from_a_pipe_is_read_and_a_fifo_nobody_writes_never_waited_on(tmp_path: Path) -> None:
    """``--config <(...)`` (a pipe) works; ``--config`` naming a FIFO without a writer waited for one
    forever. It reads as an empty file now."""
    reader, writer = os.pipe()
    os.write(writer, b"[supervisor]\npool_size = 3\n")
    os.close(writer)
    try:
        assert load_config(f"/dev/fd/{reader}", env={}).config.supervisor.pool_size == 3
    finally:
        os.close(reader)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = cli("--store", "st", "--config", str(fifo), "ls", cwd=tmp_path, env=FAST)
    assert "Traceback" not in done.stderr and done.returncode in (0, 2), done.stderr


def test_a_config_file_over_a_mebibyte_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_config(path, env={})


@pytest.mark.parametrize("value", ['""', '"a\\u0000b"'])
def test_an_empty_or_nul_store_path_is_a_config_error(tmp_path: Path, value: str) -> None:
    """``path = ""`` made a store in the working folder itself; a NUL byte was a ``ValueError`` traceback."""
    config = tmp_path / "deploy.toml"
    config.write_text(f"[store]\npath = {value}\n")
    with pytest.raises(ConfigError, match="store.path"):
        load_config(config, env={})
    done = cli("--config", str(config), "ls", cwd=tmp_path, env=FAST)
    assert "store.path" in refused(done, "CONFIG_INVALID")
    assert os.listdir(tmp_path) == ["deploy.toml"]


def test_an_empty_store_flag_or_variable_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SUBAGENTS_STORE"):
        load_config(None, env={"SUBAGENTS_STORE": ""})
    done = cli("--store", "", "run", "echo", "--prompt", "hi", cwd=tmp_path, env=FAST)
    assert "--store" in refused(done, "USAGE")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("line", ["lease_ttl_s = inf", "lease_ttl_s = nan", "control_poll_s = inf", "pool_size = 1e9"])
def test_values_no_deployment_can_mean_are_config_errors(tmp_path: Path, line: str) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text(f"[supervisor]\n{line}\n")
    with pytest.raises(ConfigError, match=line.split(" ")[0]):
        load_config(config, env={})


def test_a_provider_without_a_name_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text('[[providers]]\nname = ""\nprogram = "echo"\n')
    with pytest.raises(ConfigError, match="name"):
        load_config(config, env={})


def test_a_tree_line_without_a_label_has_no_dangling_dash() -> None:
    """Found by a README probe: an unlabelled child's ``tree`` line read ``— `` then two spaces."""
    from subagents.supervisor.cli.columns import tree_line

    row = {"status": "complete", "outcome": "error", "error": "boom", "error_code": "X", "label": None}
    assert tree_line(row, "01ABC") == "01ABC [complete, error] (boom)"
    assert tree_line({**row, "label": "part-1"}, "01ABC") == "01ABC [complete, error] — part-1 (boom)"
