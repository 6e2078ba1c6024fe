"""The processes a worker's programs started: ended with the worker.

A program may start processes (``subprocess.Popen``, ``multiprocessing``, a
shell's ``&``) and return, or be cancelled while it waits on one. Nothing ended
them: they outlived the turn's worker, reparented to init, and the supervisor's
close left them running for good. So whoever ends a worker ends its
descendants first, with SIGKILL: the worker itself on its way out
(``worker/main.py``), and the pool when it kills a worker (a turn that ignored
its cancellation, a close that waited long enough: ``supervisor/pool.py``).

They are found by their parent links (``/proc/<pid>/stat``), which the death of
a process cuts (its children go to init): so every one is stopped (SIGSTOP)
before any is killed, and a stopped process starts no more. A process that
left the tree on purpose (a daemon's double fork, reparented to init) is no
descendant and is left alone; so is everything when the worker itself died
unasked (``kill -9``, the kernel's OOM killer), since its children were
reparented before anyone could look. A process that outlives its turn on a
worker that lives on is left to run: it may be the program's on purpose.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Callable, Iterable

from subagents.store.lease import process_start_time

__all__ = ["descendants", "end_descendants", "running", "stopped"]

_PASSES = 3  # walks of the tree: the last finds none new unless processes keep starting while they are stopped


class _NoChildrenFiles(Exception):
    """This kernel keeps no ``/proc/<pid>/task/<tid>/children`` lists (``CONFIG_PROC_CHILDREN`` unset)."""


def _children_of(pid: int) -> list[int]:
    """The children of ``pid``, from each of its threads' ``children`` list (a few reads, not one per process)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone meanwhile
        return []
    found: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found.extend(int(child) for child in handle.read().split())
        except FileNotFoundError:
            if os.path.exists(f"/proc/{pid}/task/{task}"):
                raise _NoChildrenFiles from None
        except OSError:  # the thread ended meanwhile
            continue
    return found


def _all_children() -> dict[int, list[int]]:
    """Each running process's children, by parent pid, from every ``/proc/<pid>/stat`` (zombies left out)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # no ``/proc`` (not Linux): nothing is found
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields and fields[0] not in (b"Z", b"X"):
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first, then the parent pid); None
    when the process is gone, or there is no ``/proc``. The name may hold spaces and parentheses: the
    fields begin after its last ``)``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(roots: Iterable[int]) -> list[int]:
    """Every live process below ``roots`` (not the roots themselves), parents before their children: a
    worker's here, a simulated Ray cluster's services' for its reaper (``supervisor/ray_cluster.py``)."""
    roots = list(roots)
    try:
        return _walk(roots, _children_of)
    except _NoChildrenFiles:
        table = _all_children()
        return _walk(roots, lambda parent: table.get(parent, []))


def _walk(roots: list[int], children_of: Callable[[int], list[int]]) -> list[int]:
    found: list[int] = []
    seen = set(roots)
    todo = list(roots)
    while todo:
        for child in children_of(todo.pop(0)):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def end_descendants(pid: int, *, with_it: bool = False) -> int:
    """SIGKILL every process below ``pid`` (and ``pid`` itself when ``with_it``); how many descendants there were.

    ``pid`` is stopped first when it is to die too, so it starts no more while its tree is read. Linux only
    (``/proc``): elsewhere nothing is found and only ``pid`` is killed.
    """
    if with_it:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    stopped: list[int] = []
    for _ in range(_PASSES):
        new = [child for child in descendants([pid]) if child not in stopped]
        if not new:
            break
        for child in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGSTOP)
        stopped.extend(new)
    for child in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    if with_it:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(stopped)


def running(pid: int) -> bool:
    """Whether process ``pid`` runs now: a zombie (ended, its parent not yet told) does not."""
    return process_start_time(pid) is not None


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped now (SIGSTOP, Ctrl-Z, or a debugger's stop): it runs nothing until it
    is continued. False when it is gone, or where there is no ``/proc``."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] in (b"T", b"t")
