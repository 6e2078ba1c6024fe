"""Shared helpers of the store tests: record builders, tree snapshots, child processes.

Child processes run ``tests/store/_child.py`` with the venv's interpreter.
Their stdout is read by a thread into a queue, so every wait has a deadline
and a hang fails with the child's stack (``faulthandler`` on SIGUSR1) and its
stderr instead of blocking the suite.
"""

from __future__ import annotations

import fcntl
import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable

from subagents import store
from subagents.store.framing import FRAME, encode_record

REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD_SCRIPT = Path(__file__).with_name("_child.py")
PYTHON = sys.executable
DEADLINE_S = 20.0

ONE_SHOT = {"version": 1, "mode": "one-shot", "provider": "spawn", "label": "worker"}
CONTINUABLE = {"version": 1, "mode": "continuable", "provider": "spawn", "label": "helper"}


# -- records and sessions -------------------------------------------------------


def records_blob(payloads: Iterable[dict[str, Any]]) -> tuple[bytes, list[int]]:
    """Framed bytes of ``payloads`` and the start offset of each record."""
    chunks, offsets, pos = [], [], 0
    for payload in payloads:
        chunk = encode_record(payload)
        offsets.append(pos)
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks), offsets


def event(seq: int, kind: str, data: Any = None, *, ts: float = 1.0, epoch: int = 0) -> dict[str, Any]:
    return {"seq": seq, "ts": ts, "type": kind, "data": {} if data is None else data, "epoch": epoch}


def refit_crc(buf: bytearray, offset: int) -> None:
    """Recompute the CRC of the frame at ``offset`` after its payload was edited."""
    length, _ = FRAME.unpack_from(buf, offset)
    body = bytes(buf[offset + FRAME.size : offset + FRAME.size + length])
    FRAME.pack_into(buf, offset, length, zlib.crc32(body))


def make_child(st: store.Store, parent: str, child: str, *, descriptor: dict[str, Any] | None = None,
               created_at: float | None = None, events: Iterable[tuple[str, Any]] = (), **kw: Any) -> store.SessionHeader:
    """A subagent child of ``parent`` whose log opens with ``descriptor``."""
    first = [("subagent/descriptor", dict(ONE_SHOT if descriptor is None else descriptor))]
    return store.create_session(st, child, parent_session=parent, origin="subagent", created_at=created_at,
                                events=first + list(events), **kw)


def read_file(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def tree_state(root: str) -> dict[str, tuple[str, int, int, bytes | str | None]]:
    """Every path under ``root`` with its kind, mode, mtime and content (file bytes, link target), links not followed."""
    state: dict[str, tuple[str, int, int, bytes | str | None]] = {}
    for folder, dirs, files in os.walk(root):
        info = os.lstat(folder)
        state[folder] = ("dir", info.st_mode, info.st_mtime_ns, None)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                state[path] = ("link", info.st_mode, info.st_mtime_ns, os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                state[path] = ("file", info.st_mode, info.st_mtime_ns, read_file(path))
            else:
                state[path] = ("other", info.st_mode, info.st_mtime_ns, None)
    return state


def wait_until(predicate: Callable[[], Any], *, timeout: float = DEADLINE_S, what: str = "condition") -> Any:
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.002)  # a poll interval, not a synchronisation sleep


# -- child processes ------------------------------------------------------------


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Child:
    """A ``_child.py`` process whose stdout lines arrive on a queue."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [PYTHON, "-P", str(CHILD_SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
            cwd=str(REPO_ROOT),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._stderr: list[bytes] = []
        threading.Thread(target=self._pump_out, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump_out(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode().rstrip("\n"))
        self.lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self._stderr.append(raw)

    def stderr(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def next_line(self, *, timeout: float = DEADLINE_S) -> str | None:
        """The next stdout line; ``None`` at end of output."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.fail(f"no output within {timeout}s")
        if line is not None:
            self.seen.append(line)
        return line

    def expect(self, prefix: str, *, timeout: float = DEADLINE_S) -> list[str]:
        """Read lines until one starts with ``prefix``; returns its fields after the prefix."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                self.fail(f"output ended before {prefix!r}")
            if line.startswith(prefix):
                return line[len(prefix) :].split()

    def fail(self, why: str) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGUSR1)  # faulthandler dumps the child's stack to stderr
                self.proc.wait(timeout=1.0)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.kill()
        raise AssertionError(f"child {self.args[0]} pid {self.pid}: {why}\nlast lines: {self.seen[-10:]}\nstderr:\n{self.stderr()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=DEADLINE_S)

    def close(self, *, timeout: float = DEADLINE_S) -> int:
        """Close stdin and wait for the exit code (killing the child on timeout)."""
        try:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail("did not exit")
            raise

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.kill()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass


def flocked(path: str | os.PathLike[str]) -> bool:
    """Whether an ``flock`` is held on ``path`` (by another open file description: probed with ``LOCK_NB``)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's own lock with its description
    return False


def blocked_on(pid: int, path: str) -> bool:
    """Whether process ``pid`` waits for a lock on the file ``path`` (a ``->`` line of ``/proc/locks``)."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as handle:
        for line in handle:
            fields = line.split()
            if "->" in fields and "FLOCK" in fields:
                at = fields.index("FLOCK")
                if fields[at + 3] == str(pid) and fields[at + 4].endswith(f":{inode}"):
                    return True
    return False


class PreadCounter:
    """``os`` for a module under test, with each ``pread``'s length noted in ``lengths``."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __getattr__(self, name):
        return getattr(os, name)

    def pread(self, fd, length, offset):
        self.lengths.append(length)
        return os.pread(fd, length, offset)
