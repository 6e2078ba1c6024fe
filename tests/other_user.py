"""Run a function as another user, to meet permission bits that root never meets.

The tests run as root, which the kernel lets past every permission bit: a store
another user made, or files of a store a ``sudo`` run left behind, are only seen
as they are by a process that is not root. ``as_nobody`` forks, drops to the
``nobody`` user in the child, runs the function there and sends back what it
returned or the error it raised (class name, ``code``, message). Everything the
function needs is imported before the fork: the child may not be able to read
the interpreter's own files once it is ``nobody``.

``shared_folder`` is a folder every user can reach (``tmp_path`` is under a
folder only root can enter), removed afterwards.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import pytest

NOBODY = 65534


@contextmanager
def shared_folder() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as another user")
    path = tempfile.mkdtemp(prefix="subagents-perm-", dir="/tmp")
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _described(exc: BaseException) -> str:
    """The message, and for a group each exception in it (what a test failing on one needs to see)."""
    if isinstance(exc, BaseExceptionGroup):
        return f"{exc}: " + "; ".join(f"{type(e).__name__}: {_described(e)}" for e in exc.exceptions)
    return str(exc)


def as_nobody(fn: Callable[[], Any], *, timeout_s: float = 30.0) -> tuple[str, Any]:
    """``("ok", value)`` or ``("error", (class name, code or None, message))`` of ``fn()`` run as nobody."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            try:
                outcome: tuple[str, Any] = ("ok", fn())
            except BaseException as exc:  # noqa: BLE001 - reported to the parent as data
                outcome = ("error", (type(exc).__name__, getattr(exc, "code", None), _described(exc)))
            os.write(write, pickle.dumps(outcome))
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    with os.fdopen(read, "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)
    os.waitpid(pid, 0)
    if not chunks:
        raise AssertionError("the child acting as nobody said nothing")
    return pickle.loads(b"".join(chunks))
