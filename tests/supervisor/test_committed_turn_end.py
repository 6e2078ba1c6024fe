"""A settled child's last ``turn/end`` damaged in place is committed damage, not a torn tail.

Its parent's settled row says where its committed records end (``Settled.end``). Read alone, a
last record cut short or changed in place looks like a crash mid-append, whose tail the resume
path cuts. ``show``, listings and ``fsck`` already read such a log against the row; these tests
hold the other readers to it: ``subagents log``, ``gc`` (which would delete a subtree holding the
only copy of a damaged transcript) and a cold resume (which would cut the committed record and
close the turn as a crash, turning a child that completed into an interrupted one).
"""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Callable

import anyio
import pytest

from subagents.store import Store, SubagentError, collect, inspect, read_mailbox
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SubagentRequest, SupervisorConfig
from subagents.supervisor.dispatch import Dispatcher

from ..conftest import open_supervisor
from ..session_bytes import age, cut_at_record, write_slot, zero_records_from
from .test_cli_gc import run_cli

pytestmark = pytest.mark.anyio

DAY = 86400.0


def _cut_last_record(path: str, by: int = 20) -> bytes:
    """Cut the last ``by`` bytes of the log's records (its last ``turn/end``); the bytes after."""
    with open(path, "rb") as handle:
        data = handle.read().rstrip(b"\0")
    with open(path, "r+b") as handle:
        handle.truncate(len(data) - by)
    with open(path, "rb") as handle:
        return handle.read()


def _flip_in_last_record(path: str) -> bytes:
    """Change one byte inside the last record, in place: its CRC fails as a torn tail's would."""
    with open(path, "rb") as handle:
        data = bytearray(handle.read())
    end = len(data.rstrip(b"\0"))
    data[end - 6] ^= 0xFF
    with open(path, "wb") as handle:
        handle.write(bytes(data))
    return bytes(data)


def _damaged(path: str, damage: Callable[[Store, str], None]) -> bytes:
    """Apply ``damage`` (a ``session_bytes`` helper's shape) to the session file at ``path``; its bytes after."""
    session_id = os.path.basename(path)
    damage(Store(os.path.dirname(os.path.dirname(path)), create=False), session_id)
    with open(path, "rb") as handle:
        return handle.read()


def _zero_last_record(path: str) -> bytes:
    """Zero the last record whole, in place: it reads like the log's padding, its turn left open."""
    return _damaged(path, lambda st, sid: zero_records_from(st, sid, -1))


def _zero_last_turn(path: str) -> bytes:
    """Zero the whole last turn, from the ``message/accepted`` before its ``turn/start``: the log reads
    clean, with no open turn, and the message it consumed reads as never taken."""
    def zero(st: Store, sid: str) -> None:
        events = inspect(st, sid).events
        zero_records_from(st, sid, max(i for i, e in enumerate(events) if e["type"] == "message/accepted"))

    return _damaged(path, zero)


def _cut_before_turn_end(path: str) -> bytes:
    """Cut at the record boundary before the last ``turn/end``: the log reads clean, its turn open."""
    return _damaged(path, lambda st, sid: cut_at_record(st, sid, -1))


async def _completed_one_shot(tmp_path) -> tuple[str, str]:
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="done"))
        assert (await run.result()).output == "done"
        await run.dispose()
    return root.id, run.id


@pytest.mark.parametrize("damage", [_cut_last_record, _flip_in_last_record])
async def test_log_calls_a_settled_childs_damaged_turn_end_corrupt(tmp_path, damage) -> None:
    _root, child = await _completed_one_shot(tmp_path)
    damage(os.path.join(tmp_path, "store", "sessions", child))
    done = run_cli(str(tmp_path / "store"), "log", child, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["log_status"] == "corrupt", doc
    assert doc["damage"] is not None


@pytest.mark.parametrize("damage", [_cut_last_record, _zero_last_record])
async def test_gc_keeps_a_subtree_whose_settled_child_lost_its_turn_end(tmp_path, damage) -> None:
    root, child = await _completed_one_shot(tmp_path)
    path = os.path.join(tmp_path, "store", "sessions", child)
    damaged = damage(path)
    st = Store(str(tmp_path / "store"), create=False)
    for session in (root, child):
        age(st, session, 8 * DAY)
    for dry_run in (True, False):
        report = collect(st, 7 * DAY, dry_run=dry_run)
        assert report.collected == (), report
        [kept] = report.skipped
        assert (kept.id, kept.session, kept.reason) == (root, child, "unreadable"), kept
        assert "CORRUPT_SESSION" in kept.detail
    with open(path, "rb") as handle:
        assert handle.read() == damaged


def _config() -> SupervisorConfig:
    return SupervisorConfig(pool_size=1, durability="none")


ECHO = Provider(name="echoc", program="echo", capabilities=Capabilities.all(), continuable=True)


@asynccontextmanager
async def _supervisor(where: Path) -> AsyncIterator[Supervisor]:
    async with Supervisor.open(store=where, config=_config()) as sup:
        sup.register_provider(ECHO)
        yield sup


async def _settled_child(where: Path, *followups: str) -> tuple[str, str]:
    """A root and a continuable child that ran its first prompt and ``followups``, each settled; both ids."""
    async with _supervisor(where) as sup:
        root = await sup.open_root(label="r")
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="echoc", prompt="first", label="c"))
        await sup.wait_for_message(root, timeout_s=30)
        for text in followups:
            await sup.followup(root, child, text)
            await sup.wait_for_message(root, timeout_s=30)
    return root.id, child


def _file_of(where: Path, child: str) -> tuple[str, bytes]:
    path = os.path.join(where, "sessions", child)
    with open(path, "rb") as handle:
        return path, handle.read()


async def _refused_resume(where: Path, root_id: str, child: str) -> SubagentError:
    """A followup from a new supervisor is ``NOT_RESUMABLE``, and no activation is left behind."""
    async with _supervisor(where) as sup:
        again = await sup.open_root(id=root_id)
        with pytest.raises(SubagentError) as caught:
            await sup.followup(again, child, "again")
        assert caught.value.code == "NOT_RESUMABLE", caught.value
        assert sup.continuation.activations == {}
    return caught.value


@pytest.mark.parametrize("damage", [_cut_last_record, _flip_in_last_record, _zero_last_turn, _cut_before_turn_end])
async def test_a_cold_resume_refuses_a_settled_child_that_lost_its_turn_end(tmp_path, damage) -> None:
    """The last two read clean (a probe found them): the resume ran the zeroed turn's message a second
    time, and retried a turn whose log would not open thousands of times a second; both then erased
    the evidence with a new ``settled`` row."""
    where = tmp_path / "st"
    root_id, child = await _settled_child(where)
    path = os.path.join(where, "sessions", child)
    damaged = damage(path)
    refused = await _refused_resume(where, root_id, child)
    assert "CORRUPT_SESSION" in refused.message or "corrupt" in refused.message, refused.message
    assert _file_of(where, child) == (path, damaged)  # refused before its lease was taken: not a byte written


async def test_a_turn_whose_log_will_not_open_settles_the_activation_instead_of_retrying(tmp_path, monkeypatch) -> None:
    """A turn that fails before it logs its message (the worker's writer refuses the log) consumed
    nothing, and the driver dispatched it again at once, thousands of times a second, the parent never
    told (a probe found it). The log is damaged here after the resume's read, as it was damaged behind
    the store's back in the probe: the activation settles ``error`` after one attempt, its message stays
    pending (durable, for a later activation), and it is not resumed for that message straight away."""
    where = tmp_path / "st"
    root_id, child = await _settled_child(where)
    path = os.path.join(where, "sessions", child)
    dispatched = []
    run_turn = Dispatcher.run_turn

    async def damaged_first(self, spec, on_rpc, *, started=None):
        if spec.session_id == child:
            if not dispatched:
                _cut_before_turn_end(path)
            dispatched.append(spec.session_id)
        return await run_turn(self, spec, on_rpc, started=started)

    monkeypatch.setattr(Dispatcher, "run_turn", damaged_first)
    async with _supervisor(where) as sup:
        ended = []
        sup.on("subagent/end", lambda _name, data: ended.append(data) if data.get("id") == child else None)
        again = await sup.open_root(id=root_id)
        message_id = await sup.followup(again, child, "second")
        with anyio.fail_after(10):
            while not ended:
                await anyio.sleep(0.02)
        await anyio.sleep(0.3)  # a resume for the pending message would dispatch again by now
        assert len(dispatched) == 1, len(dispatched)
        assert ended[0]["stop_reason"] == "error", ended
        assert sup.continuation.activations == {}
    st = Store(str(where), create=False)
    assert [m.id for m in read_mailbox(st, child)][-1] == message_id
    assert message_id not in [e["data"].get("message_id") for e in inspect(st, child).events if e["type"] == "message/accepted"]


async def test_a_cold_resume_refuses_a_child_whose_lease_slots_were_emptied(tmp_path) -> None:
    """Both slots zeroed read as "never leased": the resume took epoch 1 after records of epoch 2
    (a probe found it). The acquisition refuses them as damage; the send says why, nothing written."""
    where = tmp_path / "st"
    root_id, child = await _settled_child(where, "second")
    for index in (0, 1):
        write_slot(Store(str(where), create=False), child, index, b"")
    damaged = _file_of(where, child)
    refused = await _refused_resume(where, root_id, child)
    assert "lease" in refused.message and "CORRUPT_SESSION" in refused.message, refused.message
    assert _file_of(where, child) == damaged
