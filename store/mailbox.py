"""Durable mailboxes: messages accepted for a session and not yet taken into a turn.

``accept`` appends a framed record ``{seq, id, ts, source, content}`` to
``sessions/<id>.mailbox`` under the session lock and fsyncs it (unless the
policy is ``none``) before it returns the message id: an accepted message
survives a crash of every process.

Consumption is recorded in the *log*, not here: the turn that takes a message
appends ``message/accepted`` (or teardown appends ``message/discarded``) with
its id. Messages are consumed in FIFO order, so the log's consumed count
(kept in the projection) is the length of the consumed prefix of the mailbox;
``pending`` checks that the last consumed id matches before trusting it.
Recovery therefore delivers each accepted message exactly once.

Readers check every record (``store/records.py``): a record of the wrong
shape is damage, and ends the valid prefix like a bad CRC — writers use the
same check, so they never append after damage a reader would stop at. A
message above the store's ``max_record_bytes`` is refused
(``MESSAGE_TOO_LARGE``) before anything is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .errors import CorruptSessionError
from .appender import append_durably
from .framing import scan
from .ids import IdGenerator
from .reader import read_session_file
from .records import mailbox_problem
from .root import Store
from .session_file import SessionLock

__all__ = ["MailboxMessage", "accept", "read_mailbox", "pending"]


@dataclass(frozen=True)
class MailboxMessage:
    id: str
    ts: float
    source: dict[str, Any]
    content: Any
    wake: bool = True
    end: int = 0  # byte offset just after this record in the mailbox file

    def to_event_data(self) -> dict[str, Any]:
        """The ``message/accepted`` data; ``mailbox_end`` lets the next reader skip the consumed prefix."""
        return {"message_id": self.id, "source": self.source, "content": self.content, "mailbox_end": self.end}


def accept(store: Store, session_id: str, *, source: dict[str, Any], content: Any, ids: IdGenerator, wake: bool = True, lock: SessionLock | None = None) -> str:
    """Durably append a message; returns its id once it is on stable storage."""
    held = lock if lock is not None else SessionLock(session_id, store.session_path(session_id))  # SessionNotFoundError
    message_id = ids.new()
    record = {"id": message_id, "ts": time.time(), "source": source, "content": content, "wake": wake}
    try:
        append_durably(store, store.path(session_id, "mailbox"), record, lock=held,
                       key=f"mailbox/{session_id}", owner=session_id, what=f"mailbox of {session_id}",
                       check=mailbox_problem, too_large="MESSAGE_TOO_LARGE")
    finally:
        if lock is None:
            held.close()
    return message_id


def _messages(data: bytes, *, start_seq: int = 0, base: int = 0) -> tuple[list[MailboxMessage], bool]:
    result = scan(data, start_seq=start_seq, base_offset=base, check=mailbox_problem)
    ends = result.offsets[1:] + [result.end]
    out = [
        MailboxMessage(r["id"], float(r["ts"]), r["source"], r.get("content"), r.get("wake", True), end)
        for r, end in zip(result.records, ends)
    ]
    # damage right at ``base`` means ``base`` is not where record ``start_seq`` starts
    return out, result.damage is not None and result.damage.offset == base and base > 0


def read_mailbox(store: Store, session_id: str) -> list[MailboxMessage]:
    """The valid prefix of the mailbox; ``UnavailableSessionError`` when the file cannot be read."""
    data = read_session_file(store, session_id, "mailbox")
    return [] if data is None else _messages(data)[0]


def pending(
    store: Store, session_id: str, *, consumed: int, last_consumed_id: str | None, mailbox_end: int | None = None
) -> list[MailboxMessage]:
    """Accepted messages the log has not consumed, in FIFO order.

    With ``mailbox_end`` (the byte offset after the last consumed message, recorded
    in its ``message/accepted``), only the unconsumed suffix is read: O(pending),
    not O(every message ever accepted). Without it, or if it does not land on
    record ``consumed``, the whole mailbox is read and checked against the log.
    """
    if mailbox_end is not None and consumed > 0:
        suffix = read_session_file(store, session_id, "mailbox", offset=mailbox_end)
        if suffix is not None:
            messages, misplaced = _messages(suffix, start_seq=consumed, base=mailbox_end)
            if not misplaced and (messages or len(suffix) == 0):
                return messages
    messages = read_mailbox(store, session_id)
    if consumed > len(messages) or (consumed and messages[consumed - 1].id != last_consumed_id):
        raise CorruptSessionError(
            session_id,
            f"mailbox and log disagree: log consumed {consumed} message(s) ending at {last_consumed_id!r}",
        )
    return messages[consumed:]
