"""Where a store handle's last append to each shared framed file ended: a bounded hint.

A children index, a mailbox and a control file are appended to by whoever holds
their lock; the appender (``store/appender.py``) remembers where its own last
append ended (byte offset, next seq) so the next one reads only what others
wrote since, not the whole file. The checkpoint is only a hint: a missing one
costs a read of the file from its start, never a wrong seq. So the map is
bounded and forgets the least recently used file: a supervisor that lives for
weeks and settles a million continuable children keeps the checkpoints of the
files it is busy with, not one per child it ever touched.

A checkpoint is also what a mailbox's torn-tail rule knows of records this
process saw whole (FORMAT.md §3.3, rule 1: damage before it is never cut). A
dropped one takes that knowledge with it, as a restart does: the file is then
judged by the rules that need no memory (a committed record after the damage,
a whole frame that fails), like any process that never saw it.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["CHECKPOINT_LIMIT", "AppendCheckpoints"]

# enough for every file of a busy host's live children; about 200 bytes each
CHECKPOINT_LIMIT = 1024

Checkpoint = tuple[int, int]  # (byte offset where the last append ended, next seq)


class AppendCheckpoints:
    """A mapping of file key to ``Checkpoint`` holding at most ``limit`` entries, least recently used dropped first.

    Not locked: each append holds its file's lock, and an ``OrderedDict``'s single operations are atomic under
    the GIL; two threads appending to different files may reorder recency, which only changes what is dropped.
    """

    def __init__(self, limit: int = CHECKPOINT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self.limit = limit
        self._entries: OrderedDict[str, Checkpoint] = OrderedDict()

    def get(self, key: str, default: Checkpoint | None = None) -> Checkpoint | None:
        entry = self._entries.get(key)
        if entry is None:
            return default
        try:
            self._entries.move_to_end(key)
        except KeyError:
            pass  # dropped by another thread in between: still a valid hint to return
        return entry

    def __setitem__(self, key: str, checkpoint: Checkpoint) -> None:
        self._entries.pop(key, None)  # re-inserted at the end: the most recently used
        self._entries[key] = checkpoint
        while len(self._entries) > self.limit:
            try:
                self._entries.popitem(last=False)
            except KeyError:
                break  # another thread emptied it

    def pop(self, key: str, default: Checkpoint | None = None) -> Checkpoint | None:
        return self._entries.pop(key, default)

    def __len__(self) -> int:
        return len(self._entries)
