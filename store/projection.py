"""Projections of a session log: identity, timing, and what resume needs.

One incremental fold (``Projection.apply``) serves three readers:

* the catalog (identity: last valid descriptor wins; timing);
* resume (first own-suffix descriptor, the open turn to close, how many
  mailbox messages the log has consumed, and where the valid log ends), so a
  100,000-event session resumes from the cached projection, not a replay;
* ``store/log.py``, which writes the projection as the session's
  ``identity`` file at commit points.

The cache is derived: a reader that finds it missing, unreadable or behind
its gate folds the log in memory instead, and never writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Literal

import os

from pydantic import Field

from .atomic import FILE_MODE, NOFOLLOW, read_bytes
from .framing import FRAME, MAX_RECORD_BYTES, encode_record, scan
from .descriptor import ContinuableDescriptor, Descriptor, DescriptorError, parse_descriptor
from .records import Checked, validate

__all__ = ["PROJECTION_VERSION", "Timing", "Projection", "encode_cache", "decode_cache", "read_cache", "write_cache"]

PROJECTION_VERSION = 2  # 2: a fork's consumption counts its own records only (a cache of 1 is folded again)


@dataclass
class Timing:
    """The reference's timing rules (docs/behaviour.md, "Timing"): settled active milliseconds, plus the open turn."""

    settled_ms: float = 0.0
    active_since: float | None = None
    active_through: float | None = None
    pending_since: float | None = None  # a turn started before any descriptor

    def to_record(self) -> dict[str, Any]:
        return {
            "settled_ms": self.settled_ms,
            "active_since": self.active_since,
            "active_through": self.active_through,
            "pending_since": self.pending_since,
        }


@dataclass
class Projection:
    """The fold of a log prefix. ``seq`` is the last folded seq (-1: nothing)."""

    seed_length: int = 0
    seq: int = -1
    end_offset: int = 0
    last_offset: int = 0  # start offset of record ``seq``
    last_ts: float = 0.0
    identity: Descriptor | str | None = None  # Descriptor, "unsupported", "corrupt" or None
    identity_seq: int | None = None
    resume: Descriptor | None = None
    resume_seq: int | None = None
    resume_error: str | None = None
    resume_seen: bool = False
    timing: Timing = field(default_factory=Timing)
    seen_descriptor: bool = False
    consumed: int = 0
    last_message_id: str | None = None
    open_turn: int | None = None
    open_step: int | None = None
    open_calls: dict[str, int] = field(default_factory=dict)
    turns: int = 0
    last_stop_reason: str | None = None
    last_diagnostic: str | None = None  # the last ``turn/end``'s diagnostic
    last_cause: str | None = None  # the last ``turn/end``'s ``cause`` (what stopped it; store/outcome.py)
    discarded: int = 0  # ``message/discarded`` records since the last ``turn/end`` (work dropped unrun)
    discard_cause: str | None = None  # the last of those records' ``cause`` (who dropped it; store/outcome.py)
    sandbox: str | None = None  # the last ``sandbox/mode`` (a later switch wins over the delegated one)
    mailbox_end: int | None = None  # mailbox offset after the last consumed message (store/mailbox.py)
    open_node: str | None = None  # where the open turn runs (its ``turn/start``'s ``node``), when it says

    # -- folding -----------------------------------------------------------

    def apply(self, event: dict[str, Any], offset: int, end_offset: int) -> None:
        kind = event.get("type")
        seq = event["seq"]
        ts = float(event.get("ts") or 0.0)
        data = event.get("data") or {}
        self.seq, self.last_offset, self.end_offset, self.last_ts = seq, offset, end_offset, ts
        if kind == "subagent/descriptor":
            self._descriptor(seq, data, ts)
        elif kind == "turn/start":
            self.open_turn, self.open_step, self.open_calls = seq, None, {}
            node = data.get("node") if isinstance(data, dict) else None
            self.open_node = node if isinstance(node, str) else None
            if seq < self.seed_length:
                return  # a fork's seed: its source's turns, not its own (neither counted nor timed)
            if self.seen_descriptor:
                self.timing.active_since = self.timing.active_through = ts
            else:
                self.timing.pending_since = ts
        elif kind == "turn/end":
            self.open_turn, self.open_step, self.open_calls, self.open_node = None, None, {}, None
            if seq < self.seed_length:
                return
            self.turns += 1
            reason = data.get("stop_reason") if isinstance(data, dict) else None
            self.last_stop_reason = reason if isinstance(reason, str) else None
            diagnostic = data.get("diagnostic") if isinstance(data, dict) else None
            self.last_diagnostic = diagnostic if isinstance(diagnostic, str) else None
            cause = data.get("cause") if isinstance(data, dict) else None
            self.last_cause = cause if isinstance(cause, str) else None
            self.discarded, self.discard_cause = 0, None
            if self.timing.active_since is not None:
                self.timing.settled_ms += max(0.0, ts - self.timing.active_since) * 1000.0
            self.timing.active_since = self.timing.active_through = None
            self.timing.pending_since = None
        else:
            if self.timing.active_since is not None:
                self.timing.active_through = ts
            if kind == "step/start":
                self.open_step = seq
            elif kind == "step/end":
                self.open_step = None
            elif kind == "tool/call" and isinstance(data, dict):
                self.open_calls[str(data.get("call_id"))] = seq
            elif kind == "tool/result" and isinstance(data, dict):
                self.open_calls.pop(str(data.get("call_id")), None)
            elif kind in ("message/accepted", "message/discarded") and isinstance(data, dict) and seq >= self.seed_length:
                # a fork's seed holds what its source consumed from the source's own mailbox: only the
                # fork's own records consumed from its mailbox, which every reader of these fields reads
                self.consumed += 1
                if kind == "message/discarded":
                    self.discarded += 1
                    cause = data.get("cause")
                    self.discard_cause = cause if isinstance(cause, str) else None
                message_id = data.get("message_id")
                self.last_message_id = message_id if isinstance(message_id, str) else None
                end = data.get("mailbox_end")
                self.mailbox_end = end if isinstance(end, int) and not isinstance(end, bool) else None
            elif kind == "sandbox/mode" and isinstance(data, dict):
                mode = data.get("mode")
                self.sandbox = mode if isinstance(mode, str) else None

    def _descriptor(self, seq: int, data: Any, ts: float) -> None:
        # one validation for both folds (``identity_of``'s verdict, the resume fold's descriptor or
        # error): every listing row folds its child's log, and this was its one validation done twice
        parsed: Descriptor | None = None
        error: str | None = None
        try:
            parsed = parse_descriptor(data)
        except DescriptorError as exc:
            error = str(exc)
        verdict: Descriptor | str = "corrupt" if error is not None else "unsupported" if parsed is None else parsed
        self.identity, self.identity_seq = verdict, seq
        if not isinstance(verdict, str):
            # every descriptor resets the settled time; a pending turn start becomes active
            self.seen_descriptor = True
            self.timing.settled_ms = 0.0
            if self.timing.pending_since is not None:
                self.timing.active_since = self.timing.pending_since
                self.timing.active_through = ts
                self.timing.pending_since = None
        if seq >= self.seed_length and not self.resume_seen:
            self.resume_seen = True
            if error is None:
                self.resume = parsed
                self.resume_seq = seq
            else:
                self.resume_error = error

    def fold(self, events: Iterable[dict[str, Any]], offsets: Iterable[int], end: int) -> None:
        offs = list(offsets) + [end]
        for i, event in enumerate(events):
            self.apply(event, offs[i], offs[i + 1])

    # -- reading -----------------------------------------------------------

    @property
    def next_seq(self) -> int:
        return self.seq + 1

    def continuable(self) -> ContinuableDescriptor | None:
        return self.resume if isinstance(self.resume, ContinuableDescriptor) else None

    # -- persistence of the cache ------------------------------------------

    def to_record(self) -> dict[str, Any]:
        ident: Any
        if isinstance(self.identity, str) or self.identity is None:
            ident = self.identity
        else:
            ident = self.identity.to_record()
        return {
            "version": PROJECTION_VERSION,
            "seed_length": self.seed_length,
            "seq": self.seq,
            "end_offset": self.end_offset,
            "last_offset": self.last_offset,
            "last_ts": self.last_ts,
            "identity": ident,
            "identity_seq": self.identity_seq,
            "resume": None if self.resume is None else self.resume.to_record(),
            "resume_seq": self.resume_seq,
            "resume_error": self.resume_error,
            "resume_seen": self.resume_seen,
            "timing": self.timing.to_record(),
            "seen_descriptor": self.seen_descriptor,
            "consumed": self.consumed,
            "last_message_id": self.last_message_id,
            "open_turn": self.open_turn,
            "open_step": self.open_step,
            "open_calls": dict(self.open_calls),
            "turns": self.turns,
            "last_stop_reason": self.last_stop_reason,
            "last_diagnostic": self.last_diagnostic,
            "last_cause": self.last_cause,
            "discarded": self.discarded,
            "discard_cause": self.discard_cause,
            "sandbox": self.sandbox,
            "mailbox_end": self.mailbox_end,
            "open_node": self.open_node,
        }

    @classmethod
    def from_record(cls, data: Any) -> "Projection | None":
        """Rebuild a cached projection; ``None`` if it is not one this build wrote (any type wrong)."""
        if not isinstance(data, dict) or data.get("version") != PROJECTION_VERSION:
            return None
        found = validate(_CacheFields, data)
        if isinstance(found, str):
            return None
        try:
            identity: Descriptor | str | None
            ident = found.identity
            identity = ident if ident is None or isinstance(ident, str) else parse_descriptor(ident)
            resume = None if found.resume is None else parse_descriptor(found.resume)
        except DescriptorError:
            return None
        t = found.timing
        return cls(
            seed_length=found.seed_length,
            seq=found.seq,
            end_offset=found.end_offset,
            last_offset=found.last_offset,
            last_ts=found.last_ts,
            identity=identity,
            identity_seq=found.identity_seq,
            resume=resume,
            resume_seq=found.resume_seq,
            resume_error=found.resume_error,
            resume_seen=found.resume_seen,
            timing=Timing(t.settled_ms, t.active_since, t.active_through, t.pending_since),
            seen_descriptor=found.seen_descriptor,
            consumed=found.consumed,
            last_message_id=found.last_message_id,
            open_turn=found.open_turn,
            open_step=found.open_step,
            open_calls=dict(found.open_calls),
            turns=found.turns,
            last_stop_reason=found.last_stop_reason,
            last_diagnostic=found.last_diagnostic,
            last_cause=found.last_cause,
            discarded=found.discarded,
            discard_cause=found.discard_cause,
            sandbox=found.sandbox,
            mailbox_end=found.mailbox_end,
            open_node=found.open_node,
        )


    @classmethod
    def from_trusted_record(cls, data: dict[str, Any]) -> "Projection":
        """``from_record`` without the field-by-field type checks, for a record another process of
        this build made with ``to_record`` and handed over directly (a turn's ``TurnSpec.log_state``,
        from the supervisor that created the session), never for bytes read from a file.

        The checks cost more than the rest of a one-shot worker's open (a pydantic
        validation of every field); descriptors are still parsed (``DescriptorError``).
        Every field ``to_record`` writes is taken, whatever fields are added later.
        """
        values = {name: data[name] for name in _PROJECTION_FIELDS if name in data}
        ident = values.get("identity")
        if isinstance(ident, dict):
            values["identity"] = parse_descriptor(ident)
        resume = values.get("resume")
        if isinstance(resume, dict):
            values["resume"] = values["identity"] if resume == ident else parse_descriptor(resume)
        t = values["timing"]
        values["timing"] = Timing(t["settled_ms"], t["active_since"], t["active_through"], t["pending_since"])
        values["open_calls"] = dict(values.get("open_calls") or {})
        return cls(**values)


# the fields ``from_trusted_record`` takes (``dataclasses.fields`` rebuilt this tuple on every call)
_PROJECTION_FIELDS = tuple(f.name for f in fields(Projection))


class _TimingFields(Checked):
    settled_ms: float
    active_since: float | None
    active_through: float | None
    pending_since: float | None


class _CacheFields(Checked):
    """The cached projection map (``Projection.to_record``), every field typed (store/records.py)."""

    version: Literal[2]
    seed_length: int = Field(ge=0)
    seq: int = Field(ge=-1)
    end_offset: int = Field(ge=0)
    last_offset: int = Field(ge=0)
    last_ts: float
    identity: Literal["unsupported", "corrupt"] | dict[str, Any] | None
    identity_seq: int | None
    resume: dict[str, Any] | None
    resume_seq: int | None
    resume_error: str | None
    resume_seen: bool
    timing: _TimingFields
    seen_descriptor: bool
    consumed: int = Field(ge=0)
    last_message_id: str | None
    open_turn: int | None
    open_step: int | None
    open_calls: dict[str, int]
    turns: int = Field(ge=0)
    last_stop_reason: str | None
    last_diagnostic: str | None  # required, like the two below: an older cache is refolded
    last_cause: str | None
    discarded: int = Field(ge=0)
    discard_cause: str | None  # required: a cache written before this field existed is refolded
    sandbox: str | None
    mailbox_end: int | None  # required: a cache written before this field existed is refolded
    open_node: str | None = None  # optional: only a cache written mid-turn has one to miss


# -- the ``identity`` cache file ------------------------------------------------------
#
# One framed record ``{seq: 0, projection: {...}}`` (framing.py), rewritten in place
# at each commit point. In place, not tmp + rename: on ext4 a rename over an existing
# file forces the new file's data out (~150 µs); a ``pwrite`` costs ~2 µs. A reader
# that races the rewrite or finds a crash's half-written record sees a short frame or
# a CRC mismatch and ignores the cache (it is derived: the log is the authority).


def encode_cache(projection: Projection) -> bytes:
    return encode_record({"seq": 0, "projection": projection.to_record()})


def decode_cache(raw: bytes) -> dict[str, Any] | None:
    """The cached projection map, or ``None`` when the bytes are not one whole valid record."""
    result = scan(raw)
    if result.damage is not None or len(result.records) != 1 or not isinstance(result.records[0].get("projection"), dict):
        return None
    return result.records[0]["projection"]


def _cache_stop(fd: int) -> int:
    """Where a read of a cache may end: one frame as its header announces it (a record within the
    format's limit), and one byte more, so that anything after it still fails ``decode_cache``. A
    stray byte far past the record (a sparse GiB) is never read."""
    head = os.pread(fd, FRAME.size, 0)
    if len(head) < FRAME.size:
        return FRAME.size
    length = FRAME.unpack(head)[0]
    if not 0 < length <= MAX_RECORD_BYTES:
        return FRAME.size + 1  # no record: the header says so
    return FRAME.size + length + 1


def read_cache(path: str) -> Projection | None:
    """The cached projection; ``None`` when absent or not valid. ``OSError`` when unreadable."""
    try:
        raw = read_bytes(path, stop=_cache_stop)
    except FileNotFoundError:
        return None
    data = decode_cache(raw)
    return None if data is None else Projection.from_record(data)


def write_cache(path: str, projection: Projection) -> None:
    blob = encode_cache(projection)
    # O_NONBLOCK: a FIFO planted in place of the cache fails the open (ENXIO) instead of blocking the writer
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | NOFOLLOW, FILE_MODE)
    try:
        os.pwrite(fd, blob, 0)
        os.ftruncate(fd, len(blob))
    finally:
        os.close(fd)
