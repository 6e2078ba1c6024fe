"""Property suite over every store file kind (issue #14): damage stays in its own session.

For each generated case (file kind × random bytes, truncation, a flipped bit,
a CRC-valid value of the wrong type, a folder, a link loop, a link out of
the store, a missing file; a file kind is a companion file, a region of a
session's file — preamble, lease slots, the newest slot, header, log — the
session file whole, or a creation's leftover) every read API is called (``_damage_cases.py``)
and, for a few cases, every read-only CLI verb with ``--json`` through
``python -m subagents.supervisor.cli``. Invariants: no uncaught exception
and no ``INTERNAL``; a damaged session never hides another; a read changes
no byte, mode or mtime, and nothing is written through a link.

The default run stays well under a minute; ``-m stress`` runs the big profile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from ._damage_cases import HOWS, KINDS, NODE_HOWS, REGIONS, Damage, build, damage, read_everything, run_case, tree_state

cases = hst.builds(
    Damage,
    kind=hst.sampled_from(KINDS),
    how=hst.sampled_from(HOWS),
    seed=hst.integers(0, 2**32 - 1),
    data=hst.binary(max_size=96),
)

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
BIG = settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(cases)
def test_every_read_survives_any_damage_to_any_file(case: Damage) -> None:
    assert run_case(case) == []


# a damage of a name (a folder, a link, a FIFO, a missing file) to a region of the session file is
# the same damage as to the session file whole: each is run once, under "session"
CELLS = [(kind, how) for kind in KINDS for how in HOWS if not (kind in REGIONS and how in NODE_HOWS)]


@pytest.mark.parametrize("kind,how", CELLS)
def test_every_kind_of_damage_to_every_file(kind: str, how: str) -> None:
    """The whole matrix once, deterministically (hypothesis samples it; this covers each cell)."""
    assert run_case(Damage(kind, how, seed=14, data=b"\x93\x01\x02" * 5)) == []


@pytest.mark.stress
@BIG
@given(cases)
def test_every_read_survives_any_damage_big(case: Damage) -> None:
    assert run_case(case) == []


# -- the read-only CLI verbs ------------------------------------------------------------------

VERBS = [["ls"], ["ls", "r"], ["tree", "r"], ["show", "c3"], ["log", "c3"], ["store", "fsck"]]
# the damages that once made the CLI print INTERNAL (issue #14); the API cases above cover the rest
CLI_CASES = [("session", "folder"), ("lease", "wrong-type"), ("mailbox", "link-loop"), ("log", "wrong-type"),
             ("header", "truncate"), ("lease-slot", "flip")]


def _cli(root: str, verb: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", root, *verb, "--json"],
                          capture_output=True, text=True, timeout=120, cwd=os.path.dirname(root))


@pytest.mark.parametrize("kind,how", CLI_CASES)
def test_read_only_cli_verbs_never_fail_internally(tmp_path, kind: str, how: str) -> None:
    st = build(str(tmp_path))
    damage(st, Damage(kind, how, seed=14, data=b"\xc1" * 9), str(tmp_path / "outside"))
    before = tree_state(st.root)
    for verb in VERBS:
        done = _cli(st.root, verb)
        assert "INTERNAL" not in done.stderr and "Traceback" not in done.stderr, (verb, done.stderr)
        if done.returncode == 0:
            json.loads(done.stdout)
        elif verb[0] == "store":
            assert done.returncode == 1 and json.loads(done.stdout)["findings"], done.stderr  # fsck: damage found
        else:
            assert done.stderr.startswith("error: ") and done.stderr.split(":")[1].strip().isupper(), (verb, done.stderr)
        if verb == ["ls", "r"] and kind not in ("parent-index",):
            rows = {r["id"]: r for r in json.loads(done.stdout)}
            assert rows["c1"]["kind"] == rows["c2"]["kind"] == "child", rows
    assert tree_state(st.root) == before
    assert read_everything(st.root, Damage(kind, how, 14)) == []
