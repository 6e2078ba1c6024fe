"""The remote writer (``worker/service_writer.py``) at the store's limits gives the local writer's verdicts.

Found by a probe on Ray: a batch the disk had no room for broke the remote writer, so a turn could not
close (no ``turn/end``: listed ``crashed``, no error code), and a coalesced batch that also carried
``turn/start`` was refused whole (the child listed ``not-started`` although it ran). And its record size
check framed seq and epoch at their widest, 16 bytes more than the record the store writes: records the
local writer stores were refused, with a size no record had.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgpack
import pytest

from subagents.store import LogWriter, Store, inspect
from subagents.store.errors import NoRoomError, RecordTooLargeError
from subagents.store.session_file import SessionFile
from subagents.worker.service_writer import ServiceSessions

from . import test_store_service
from .test_store_service import ServiceHost, appends, leased


st, host = test_store_service.st, test_store_service.host  # the same fixtures (assignments: no unused import)


def disk_with_room(monkeypatch: pytest.MonkeyPatch, path: str, room: int) -> None:
    """The file at ``path`` may grow by ``room`` bytes more: a write past that is short, as the kernel
    makes it on a full disk (what fits is written, the rest not), and the store cuts it back."""
    limit = os.path.getsize(path) + room
    real = SessionFile.write_log

    def write_log(self: SessionFile, blob: bytes, offset: int) -> bool:
        if os.fstat(self.fd).st_ino != os.stat(path).st_ino:
            return real(self, blob, offset)
        at = self.data_start + offset
        if at + len(blob) <= limit:
            return real(self, blob, offset)
        os.pwrite(self.fd, blob[: max(0, limit - at)], at)
        return False

    monkeypatch.setattr(SessionFile, "write_log", write_log)


def test_a_coalesced_batch_the_disk_has_no_room_for_keeps_what_fits_and_the_turn_closes(
    st: Store, host: ServiceHost, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``turn/start``, a short message, a 64 KiB one and another short one go out as one coalesced batch;
    the disk has room for 16 KiB. As the local writer appending them one by one: the first two land, the
    64 KiB append is refused with ``NoRoomError`` (``DURABILITY_FAILED``), what was queued behind it is
    dropped (the log stays a prefix of what the turn wrote), and the writer takes the turn's closing
    ``turn/end`` after it."""
    epoch = leased(st, "s1")
    writer = ServiceSessions(host.call).open_writer("s1", epoch=epoch)
    disk_with_room(monkeypatch, st.session_path("s1"), 16 * 1024)
    with writer._cond:  # the sender cannot take a batch until all four are queued: one coalesced batch
        writer.append([("turn/start", {"message_id": "m"})])
        writer.append([("assistant/message", {"text": "first"})])
        writer.append([("assistant/message", {"text": "y" * 65536})])
        writer.append([("assistant/message", {"text": "queued behind it"})])
    with pytest.raises(NoRoomError) as refused:
        asyncio.run(writer.flush())
    assert refused.value.code == "DURABILITY_FAILED"
    assert len(appends(host)[0]["events"]) > 65536  # the four went out together, and were refused whole
    writer.append([("turn/end", {"stop_reason": "error", "diagnostic": "DURABILITY_FAILED"})], commit=True)
    asyncio.run(writer.flush())
    writer.close()
    events = inspect(st, "s1").events
    assert [(e["seq"], e["type"], e["data"].get("text")) for e in events] == [
        (0, "turn/start", None), (1, "assistant/message", "first"), (2, "turn/end", None)]


def test_a_refusal_for_no_room_is_raised_once_then_the_writer_goes_on(st: Store, host: ServiceHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``LogWriter.append`` raising ``NoRoomError`` and taking the next append: the refusal reaches the
    turn once (at its next ``append`` or ``flush``), not again at every later append."""
    epoch = leased(st, "s1")
    writer = ServiceSessions(host.call).open_writer("s1", epoch=epoch)
    writer.append([("turn/start", {"message_id": "m"})])
    asyncio.run(writer.flush())
    disk_with_room(monkeypatch, st.session_path("s1"), 8 * 1024)
    writer.append([("assistant/message", {"text": "y" * 65536})])
    with pytest.raises(NoRoomError):
        asyncio.run(writer.flush())
    writer.append([("assistant/message", {"text": "small"})])
    asyncio.run(writer.flush())
    writer.close()
    assert [(e["seq"], e["data"].get("text")) for e in inspect(st, "s1").events] == [(0, None), (1, "small")]


def sized_text(limit: int, seq: int, epoch: int, over: int) -> str:
    """A text whose ``assistant/message`` record at ``seq`` packs to exactly ``limit + over`` bytes (what the limit is of)."""
    for length in range(limit - 200, limit):
        record = {"seq": seq, "ts": 0.0, "type": "assistant/message", "data": {"text": "r" * length}, "epoch": epoch}
        if len(msgpack.packb(record, use_bin_type=True)) == limit + over:
            return "r" * length
    raise AssertionError("no length frames to that size")


@pytest.mark.parametrize("over", [0, 1])
def test_a_record_at_the_limit_gets_the_local_writers_verdict_and_its_real_size(tmp_path: Path, over: int) -> None:
    """A record of exactly ``max_record_bytes`` is stored, one byte more is refused, by both writers; the
    refusal names the record's real size. The remote check framed seq and epoch at 2**64-1 (9 bytes
    each) and refused records 16 bytes short of the limit, naming a size 16 bytes too large. Both name the
    refused event's type in a field (``event``), which a program matches on instead of the message's words."""
    limit = 4096
    verdicts = []
    for name in ("local", "remote"):
        st = Store(tmp_path / name, durability="strict", max_record_bytes=limit)
        epoch = leased(st, "s1")
        text = sized_text(limit, 1, epoch, over)
        host = ServiceHost(st) if name == "remote" else None
        writer = (ServiceSessions(host.call, max_record_bytes=limit).open_writer("s1", epoch=epoch) if host is not None
                  else LogWriter.open(st, "s1", epoch=epoch))
        try:
            writer.append([("turn/start", {"message_id": "m"})])
            try:
                writer.append([("assistant/message", {"text": text})])
                verdict: object = "stored"
            except RecordTooLargeError as exc:
                verdict = (exc.code, exc.fields["size"], exc.fields.get("event"))
            if host is not None:
                asyncio.run(writer.flush())  # type: ignore[union-attr]
        finally:
            writer.close()
            if host is not None:
                host.close()
        verdicts.append(verdict)
        if verdict == "stored":
            assert inspect(st, "s1").events[-1]["data"]["text"] == text
    expected = "stored" if over == 0 else ("RECORD_TOO_LARGE", limit + 1, "assistant/message")
    assert verdicts == [expected, expected]
