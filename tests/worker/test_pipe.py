"""FrameReader: a Connection's stream split into messages, a pipeful at a time."""

from __future__ import annotations

import os
import threading

import multiprocess

from subagents.worker.pipe import FrameReader, frame


def test_a_burst_of_messages_is_read_at_once():
    """Several sends already in the pipe come back from one read, in order."""
    ours, theirs = multiprocess.Pipe(duplex=True)
    for i in range(5):
        theirs.send_bytes(f"message {i}".encode())
    reader = FrameReader(ours.fileno())
    assert reader.read_available() == [f"message {i}".encode() for i in range(5)]


def test_a_message_split_across_reads_is_kept_until_complete():
    """A payload larger than one read arrives whole, after the reads that carry it."""
    ours, theirs = multiprocess.Pipe(duplex=True)
    big = bytes(range(256)) * 1024  # 256 KiB: several reads of the pipe
    import threading

    sender = threading.Thread(target=lambda: (theirs.send_bytes(big), theirs.send_bytes(b"after")))
    sender.start()
    reader = FrameReader(ours.fileno())
    got: list[bytes] = []
    while len(got) < 2:
        batch = reader.read_available()
        assert batch is not None
        got += batch
    sender.join()
    assert got == [big, b"after"]


def _write_all(fd: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:
        view = view[os.write(fd, view):]


def test_framed_messages_read_as_sent_messages():
    """``frame`` writes what ``send_bytes`` would have sent message by message: ``recv_bytes`` and
    ``FrameReader`` both read them back, in order (an empty message and one of several reads included)."""
    messages = [b"first", b"", bytes(range(256)) * 1024, b"last"]
    for read_with_reader in (False, True):
        ours, theirs = multiprocess.Pipe(duplex=True)
        theirs.send_bytes(b"before")
        sender = threading.Thread(target=_write_all, args=(theirs.fileno(), frame(messages)))  # one write of them all
        sender.start()
        if read_with_reader:
            reader = FrameReader(ours.fileno())
            got: list[bytes] = []
            while len(got) < 1 + len(messages):
                batch = reader.read_available()
                assert batch is not None
                got += batch
        else:
            got = [ours.recv_bytes() for _ in range(1 + len(messages))]
        sender.join()
        assert got == [b"before", *messages]


def test_end_of_file_reads_as_none():
    """The other end closed: ``None``, not an empty list."""
    ours, theirs = multiprocess.Pipe(duplex=True)
    theirs.send_bytes(b"last")
    theirs.close()
    reader = FrameReader(ours.fileno())
    assert reader.read_available() == [b"last"]
    assert reader.read_available() is None
