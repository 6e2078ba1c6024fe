"""kill -9 of ``migrate`` after every one of its steps, then again during the re-run (issue 12).

The version-1 store of ``tests/store/_v1_store.py`` (roots, children, a torn
tail, pending mail, leases, a crashed creation, an unfinished ``gc``) is
migrated once without interruption: the reference. Then, for every step N of
that run, a copy is migrated by a process that SIGKILLs itself right after its
N-th change (``SUBAGENTS_MIGRATE_KILL_AFTER``). The killed store:

* keeps every session whole in exactly one place (its v1 folder, the folder
  set aside, or its converted file), and the trash entry whole;
* is refused by ``Store`` with the command that finishes it (until the last
  step, the final marker, is done);

then a re-run, itself killed after a few steps for most N, and a last run
finish it: the store is byte for byte the reference. The processes are
forked from one driver process (one interpreter start for every kill).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

import msgpack

from subagents.store import STORE_VERSION, Store, StoreFormatError
from subagents.store.migrate import migrate
from subagents.store.session_file import SessionFile
from ._killed import run_killed_after
from tests.store._v1_store import build_sample, snapshot, v3_store

SESSIONS = ("c1", "c2", "c3", "r1", "r2")

def run_killed(jobs: list[tuple[Path, int]]) -> dict[str, int | None]:
    """Migrate each store in a process killed after its given step; the signal each died of (None: it finished)."""
    return run_killed_after(jobs, imports="from subagents.store.migrate import KILL_AFTER_ENV, migrate", call="migrate(path)")


def whole_once(root: Path, companions: dict[str, bytes]) -> None:
    """Every session is whole in one place: its converted file, else exactly one of its v1 folder
    and the folder set aside; each companion file is in exactly one place, unchanged; the trash
    entry is whole."""
    sessions = root / "sessions"
    for sid in SESSIONS:
        if (sessions / sid).is_file():
            with SessionFile.open(sid, str(sessions / sid)) as file:
                assert file.header_map["id"] == sid
        else:
            places = [p for p in (sessions / sid, sessions / f".{sid}.v1") if p.exists()]
            assert len(places) == 1, (sid, sorted(os.listdir(sessions)))
            assert (places[0] / "header").is_file() and (places[0] / "log").is_file(), (sid, places)
    for name, blob in companions.items():
        sid, _, kind = name.partition("/")
        places = [p for p in (sessions / sid / kind, sessions / f".{sid}.v1" / kind, sessions / f"{sid}.{kind}") if p.is_file()]
        assert [p.read_bytes() for p in places] == [blob], name
    entry = root / "trash" / "t1.0badcafe"
    assert (entry / "header").is_file() or (entry / "session").is_file()


def migrated_sample(tmp_path: Path) -> tuple[Path, int, dict[str, bytes | None]]:
    """The version-1 sample store (``template``), and what an uninterrupted ``migrate`` of a copy of
    it does: its number of steps and the snapshot of what it leaves."""
    template = tmp_path / "template"
    build_sample(template)
    reference = tmp_path / "reference"
    shutil.copytree(template, reference)
    steps = migrate(reference).steps
    return template, steps, snapshot(reference)


def test_a_kill_after_any_step_leaves_a_store_the_next_run_finishes(tmp_path):
    template, steps, expected = migrated_sample(tmp_path)
    before = snapshot(template)
    companions = {f"{sid}/{kind}": before[f"sessions/{sid}/{kind}"] for sid in SESSIONS for kind in ("identity", "mailbox", "control")
                  if f"sessions/{sid}/{kind}" in before}
    assert steps >= 25  # the sample makes every kind of step: a changed conversion must not shrink this test unnoticed

    copies = []
    for n in range(1, steps + 1):
        copies.append((tmp_path / f"k{n}", n))
        shutil.copytree(template, copies[-1][0])
    died = run_killed(copies)
    for path, n in copies:
        assert died[str(path)] == signal.SIGKILL, n
        whole_once(path, companions)
        if n < steps:
            with pytest.raises(StoreFormatError) as caught:
                Store(path, create=False)
            assert "subagents store migrate" in caught.value.message, n
    # the re-run is killed too, after 1 to 3 of its own steps
    again = run_killed([(path, n % 3 + 1) for path, n in copies if n < steps])
    assert sum(again[str(p)] == signal.SIGKILL for p, n in copies if n < steps) >= steps // 2  # most re-runs die too
    for path, n in copies:
        whole_once(path, companions)
        report = migrate(path)
        assert report.resumed or report.from_version == STORE_VERSION, n
        assert snapshot(path) == expected, n
        assert Store(path, create=False).session_ids() == list(SESSIONS)


def test_leftover_temporary_files_are_rewritten_or_removed(tmp_path):
    """A v2 file cut short while written (a kill mid-write), and one whose source is gone."""
    build_sample(tmp_path / "reference")
    migrate(tmp_path / "reference")
    build_sample(tmp_path / "s")
    (tmp_path / "s" / "sessions" / ".c2.v2").write_bytes(b"SAS2\x00")
    (tmp_path / "s" / "sessions" / ".zz.v2").write_bytes(b"SAS2")
    migrate(tmp_path / "s")
    assert snapshot(tmp_path / "s") == snapshot(tmp_path / "reference")


def v2_store(root: Path) -> None:
    """A store as a build of version 2 left it: ``build_sample`` converted by ``migrate`` (whose
    session files are what version 2's conversion wrote, unpadded), its marker at version 2."""
    build_sample(root)
    migrate(root)
    marker = root / "STORE"
    marker.write_bytes(msgpack.packb({**msgpack.unpackb(marker.read_bytes()), "version": 2}))


def test_a_kill_of_the_version_2_conversion_leaves_a_store_the_next_run_finishes(tmp_path):
    """Version 2 to 4 is one atomic replace of the marker: killed right after it, the store is converted;
    killed before its rename (a temporary marker left behind), it is still version 2 and the next run
    converts it. No session byte changes either way."""
    v2_store(tmp_path / "killed")
    before = snapshot(tmp_path / "killed")
    assert run_killed([(tmp_path / "killed", 1)]) == {str(tmp_path / "killed"): signal.SIGKILL}
    after = snapshot(tmp_path / "killed")
    assert msgpack.unpackb(after["STORE"])["version"] == STORE_VERSION
    assert {k: v for k, v in after.items() if k != "STORE"} == {k: v for k, v in before.items() if k != "STORE"}
    assert migrate(tmp_path / "killed").steps == 0
    v2_store(tmp_path / "torn")
    (tmp_path / "torn" / "STORE.tmp.12345.0badcafe").write_bytes(b"\x83")  # a replace killed before its rename
    with pytest.raises(StoreFormatError) as caught:
        Store(tmp_path / "torn", create=False)
    assert "subagents store migrate" in caught.value.message
    report = migrate(tmp_path / "torn")
    assert (report.from_version, report.steps) == (2, 1)
    assert Store(tmp_path / "torn", create=False).session_ids() == list(SESSIONS)


def test_a_conversion_a_version_2_build_started_is_finished(tmp_path):
    """A store a build of version 2 was converting from version 1 when it died (``migrating: 2``)."""
    reference = tmp_path / "reference"
    build_sample(reference)
    migrate(reference)
    stopped = tmp_path / "stopped"
    build_sample(stopped)
    assert run_killed([(stopped, 6)]) == {str(stopped): signal.SIGKILL}
    marker = stopped / "STORE"
    info = msgpack.unpackb(marker.read_bytes())
    assert info["migrating"] == STORE_VERSION
    marker.write_bytes(msgpack.packb({**info, "version": 2, "migrating": 2}))  # what version 2 wrote at its first step
    report = migrate(stopped)
    assert report.resumed
    assert snapshot(stopped) == snapshot(reference)


def test_a_kill_of_the_version_3_conversion_at_any_step_leaves_a_store_the_next_run_finishes(tmp_path):
    """Version 3 to 4 removes the lock files beside the indexes, then replaces the marker. Killed after
    either removal the store is still version 3 (refused, naming the command; a version-3 build would
    make a missing lock file again), and the next run finishes it; killed after the marker, it is done.
    No session or index byte changes."""
    reference = tmp_path / "reference"
    v3_store(reference)
    steps = migrate(reference).steps
    assert steps == 3  # two lock files, then the marker
    expected = snapshot(reference)
    copies = []
    for n in range(1, steps + 1):
        copies.append((tmp_path / f"k{n}", n))
        v3_store(copies[-1][0])
    died = run_killed(copies)
    for path, n in copies:
        assert died[str(path)] == signal.SIGKILL, n
        if n < steps:
            with pytest.raises(StoreFormatError) as caught:
                Store(path, create=False)
            assert "subagents store migrate" in caught.value.message, n
        migrate(path)
        assert snapshot(path) == expected, n
        assert Store(path, create=False).session_ids() == list(SESSIONS)
