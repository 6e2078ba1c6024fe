"""``pool = "ray"`` fails at ``Supervisor.open``, before anything exists, when Ray cannot serve this host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from subagents.supervisor.errors import RayUnavailableError
from subagents.supervisor.ray_cluster import require_ray

REPO_ROOT = Path(__file__).resolve().parents[2]

# a driver in which Ray cannot be imported (a finder hides it), opening a supervisor with pool = "ray"
_WITHOUT_RAY = r"""
import importlib.abc, json, os, sys

class HideRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, HideRay())
import anyio
from subagents import Supervisor, SupervisorConfig

async def main():
    try:
        async with Supervisor.open(store=sys.argv[1], config=SupervisorConfig(pool="ray", pool_size=1)):
            pass
    except Exception as exc:
        print(json.dumps({"code": getattr(exc, "code", None), "message": str(exc), "created": os.path.exists(sys.argv[1])}))

anyio.run(main)
"""


def test_missing_ray_is_a_clear_error_before_anything_exists(tmp_path: Path) -> None:
    store = tmp_path / "st"
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_RAY, str(store)], capture_output=True, text=True, check=True, cwd=tmp_path, timeout=60,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["code"] == "RAY_UNAVAILABLE"
    assert "pip install 'subagents[ray]'" in result["message"]
    assert result["created"] is False


def test_ray_needs_an_asyncio_loop() -> None:
    """Outside an asyncio loop (a trio host, or no loop) the check names the loop it needs."""
    with pytest.raises(RayUnavailableError, match="asyncio event loop") as info:
        require_ray()
    assert info.value.code == "RAY_UNAVAILABLE"


_UNREACHABLE = r"""
import json, os, socket, sys, time
import anyio
from subagents import Supervisor, SupervisorConfig
from subagents.supervisor.config import RayConfig

probe = socket.socket()
probe.bind(("127.0.0.1", 0))
port = probe.getsockname()[1]
probe.close()  # nothing listens there now: a connection is refused

async def main():
    started = time.monotonic()
    try:
        config = SupervisorConfig(pool="ray", pool_size=1, ray=RayConfig(address=f"127.0.0.1:{port}"))
        async with Supervisor.open(store=sys.argv[1], config=config):
            pass
    except Exception as exc:
        print(json.dumps({"code": getattr(exc, "code", None), "message": str(exc), "port": port, "s": time.monotonic() - started}))

anyio.run(main)
"""


def test_a_cluster_address_where_nothing_answers_is_refused_at_once(tmp_path: Path) -> None:
    """``ray.init`` of an address nothing listens on retried for minutes and ignored Ctrl-C (found by a
    probe with ``subagents demo --pool ray --ray-address 127.0.0.1:1``): the address is tried first."""
    env = {"RAY_USAGE_STATS_ENABLED": "0", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    try:
        out = subprocess.run([sys.executable, "-c", _UNREACHABLE, str(tmp_path / "st")], capture_output=True, text=True,
                             cwd=tmp_path, timeout=60, env=env).stdout
    except subprocess.TimeoutExpired:
        pytest.fail("Supervisor.open of an address where nothing answers did not return within 60 s")
    result = json.loads(out.strip().splitlines()[-1])
    assert result["code"] == "RAY_UNAVAILABLE"
    assert result["message"].startswith(f"cannot join the Ray cluster at '127.0.0.1:{result['port']}': nothing answers there"), result
