"""The distribution installs one import name, ``subagents`` (issue 10, item 6).

The bare names ``supervisor``, ``worker`` and ``store`` belong to other
packages on the index (``supervisor`` is supervisord); installing both into
one environment must not break either.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import subagents
from subagents import supervisor

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("store", "worker", "supervisor")


def test_public_api_is_the_supervisors():
    """``import subagents`` gives the same names as ``subagents.supervisor``."""
    assert sorted(subagents.__all__) == sorted(supervisor.__all__)
    for name in subagents.__all__:
        assert getattr(subagents, name) is getattr(supervisor, name)


def test_imports_from_another_folder(tmp_path):
    """From a folder outside the checkout, ``subagents`` imports and the bare room names do not."""
    code = (
        "import importlib.util, subagents, subagents.store, subagents.worker, subagents.supervisor\n"
        "print(subagents.Supervisor.__module__)\n"
        "print([n for n in ('store', 'worker') if importlib.util.find_spec(n) is not None])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    module, bare = out.stdout.splitlines()
    assert module == "subagents.supervisor.service"
    assert bare == "[]"


def test_worker_import_does_not_load_the_host_side():
    """``import subagents.worker`` (what a worker process does) loads nothing of the supervisor."""
    code = "import sys, subagents.worker.main; print(sorted(m for m in sys.modules if m.startswith('subagents.supervisor')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def _source_packages() -> set[str]:
    found = {"subagents"}
    for init in (REPO / "subagents").rglob("__init__.py"):  # sub-packages of the top package itself (subagents.testing)
        found.add(".".join(init.parent.relative_to(REPO).parts))
    for room in ROOMS:
        for init in (REPO / room).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO).parts
            found.add(".".join(("subagents", *rel)))
    return found


def test_wheel_holds_only_subagents(tmp_path):
    """A built wheel installs no top-level module but ``subagents``, and every room's sub-package."""
    pytest.importorskip("wheel")
    # built from a copy of the tracked sources: setuptools writes build/ beside what it builds,
    # and a build/ left in the checkout would both dirty it and ship stale modules in later wheels
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (t.decode() for t in tracked)):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("subagents-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"subagents"}
    packaged = {os.path.dirname(name).replace("/", ".") for name in names if name.endswith("/__init__.py")}
    assert packaged == _source_packages(), "pyproject.toml [tool.setuptools] packages is out of date"
    assert "subagents/store/FORMAT.md" in names
