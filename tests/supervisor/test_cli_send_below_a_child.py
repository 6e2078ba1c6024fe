"""``subagents send`` to a continuable child whose parent is a one-shot child, not a root.

Found by a probe: such a parent takes no message, so the child's settlement notice is
dropped (as the reference drops it), and ``send``, which prints that notice when the parent
is a root, printed the message id alone: a turn that completed and one that never ran
read the same. The command ran the turn itself, so it prints the child's closing
message, and says why no notice went to the parent.
"""

from __future__ import annotations

import json
from pathlib import Path

from subagents.store import Store, find_roots, list_children

from .test_cli import FAST, cli

CONFIG = """
[[providers]]
name = "script"
program = "script"
capabilities = ["all"]
continuable = true
"""


def _grandchild(tmp_path: Path) -> tuple[str, str]:
    """A one-shot child of a root (the ``run``), which started a continuable child and completed."""
    (tmp_path / "deploy.toml").write_text(CONFIG)
    grand = {"start_continuable": {"prompt": {"script": [{"return": "first"}]}, "label": "grand", "provider": "script"}}
    done = cli("--config", "deploy.toml", "--store", "st", "run", "script",
               "--prompt", json.dumps({"script": [grand, {"return": "parent done"}]}), cwd=tmp_path, env=FAST)
    assert done.returncode == 0, done.stderr
    st = Store(tmp_path / "st", create=False)
    [root] = find_roots(st).rows
    [parent] = list_children(st, root.id)
    [child] = list_children(st, parent.id)
    return parent.id, child.id


def test_send_below_a_one_shot_parent_prints_the_closing_message(tmp_path: Path) -> None:
    parent, child = _grandchild(tmp_path)
    done = cli("--config", "deploy.toml", "--store", "st", "send", child, json.dumps({"script": [{"return": "second answer"}]}),
               "--parent", parent, cwd=tmp_path, env=FAST)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    assert lines[1] == "second answer", done.stdout
    assert lines[2] == f"no settlement notice: its parent {parent} is a one-shot child, which takes no message", done.stdout
