"""Inodes allocated and freed, and fsyncs, counted from an ``strace`` of a benchmark run.

Used by ``one_shot.py`` for ``inodes_per_child`` and ``fsyncs_per_child``: the
run is repeated under ``strace -f -yy`` (every thread and process, file
descriptors shown with their paths), and the trace is replayed here on a
model of the file system's names: a path first created with ``O_CREAT`` or
``mkdir`` is a new inode, and so is an unnamed file (``O_TMPFILE``), known by
its ``/proc/self/fd/<fd>`` until ``linkat`` names it (a later open that reuses
its fd number frees it if it never got a name); ``link`` adds a name to an
inode; ``rename`` onto an existing name and ``unlink`` of an inode's last name
free it. Only paths
under the store's folder count, and only between the two marker opens the
traced program makes (``begin_marker`` / ``end_marker``), though the model is
fed from the start so names made during warm-up are known.

Counts are exact for what the store does (fresh folders, no pre-existing
files): an ``O_CREAT`` open of a name created before the trace started would
be miscounted as new, and the store folder is always made by the traced run.
Unnamed files are keyed by fd number alone, not by process: only the
supervisor's process makes them.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass

__all__ = ["TRACED_SYSCALLS", "Counts", "count_trace", "strace_available", "begin_marker", "end_marker"]

TRACED_SYSCALLS = "openat,open,creat,mkdir,mkdirat,rename,renameat,renameat2,link,linkat,unlink,unlinkat,rmdir,fsync,fdatasync"

_LINE = re.compile(r"^(\d+)\s+(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+)(?:<([^>]*)>)?")
# a path argument: optionally a directory fd shown with its path, then a quoted name
_PATH_ARG = re.compile(r'(?:(?:\d+|AT_FDCWD)<([^>]*)>,\s*)?"((?:[^"\\]|\\.)*)"')
_FD_ARG = re.compile(r"^(\d+)<([^>]*)>")


def begin_marker(folder: str) -> str:
    return os.path.join(folder, "MARK-begin-counting")


def end_marker(folder: str) -> str:
    return os.path.join(folder, "MARK-end-counting")


def strace_available() -> bool:
    return shutil.which("strace") is not None


@dataclass(frozen=True)
class Counts:
    inodes_created: int
    inodes_freed: int
    fsyncs: int


class _Names:
    """Names → inode ids, with link counts; what the traced calls did to the store's folder."""

    def __init__(self) -> None:
        self.inode_of: dict[str, int] = {}
        self.links: dict[int, int] = {}
        self.next_id = 0

    def create(self, path: str) -> bool:
        if path in self.inode_of:
            return False
        self.next_id += 1
        self.inode_of[path] = self.next_id
        self.links[self.next_id] = 1
        return True

    def drop(self, path: str) -> bool:
        """Remove a name; True when that freed its inode."""
        inode = self.inode_of.pop(path, None)
        if inode is None:
            return False
        self.links[inode] -= 1
        if self.links[inode] == 0:
            del self.links[inode]
            return True
        return False

    def link(self, old: str, new: str) -> None:
        inode = self.inode_of.get(old)
        if inode is not None:
            self.inode_of[new] = inode
            self.links[inode] += 1

    def rename(self, old: str, new: str) -> bool:
        """Move a name; True when the target's previous inode was freed."""
        freed = self.drop(new) if new in self.inode_of else False
        inode = self.inode_of.pop(old, None)
        if inode is not None:
            self.inode_of[new] = inode
        return freed


def _paths(args: str) -> list[str]:
    out = []
    for directory, name in _PATH_ARG.findall(args):
        name = name.encode().decode("unicode_escape")
        out.append(os.path.normpath(name if name.startswith("/") or not directory else os.path.join(directory, name)))
    return out


def _joined_lines(path: str) -> list[tuple[str, str]]:
    """(pid, complete call text): strace splits a call interrupted by another thread in two lines."""
    pending: dict[str, str] = {}
    out = []
    with open(path, errors="replace") as handle:
        for raw in handle:
            m = _LINE.match(raw.rstrip("\n"))
            if not m:
                continue
            pid, text = m.groups()
            if text.endswith("<unfinished ...>"):
                pending[pid] = text[: -len("<unfinished ...>")].rstrip()
                continue
            if text.startswith("<... "):
                head = pending.pop(pid, None)
                if head is None:
                    continue
                text = head + text.split("resumed>", 1)[1]
            out.append((pid, text))
    return out


def count_trace(trace_path: str, store_folder: str, markers_folder: str) -> Counts:
    """Replay ``trace_path``; the counts of calls under ``store_folder`` between the markers."""
    store_folder = os.path.normpath(store_folder)
    begin, end = begin_marker(markers_folder), end_marker(markers_folder)
    names = _Names()
    counting = False
    created = freed = fsyncs = 0

    def inside(path: str) -> bool:
        return path == store_folder or path.startswith(store_folder + os.sep)

    for _pid, text in _joined_lines(trace_path):
        m = _CALL.match(text)
        if not m:
            continue
        call, args, ret, ret_path = m.group(1), m.group(2), int(m.group(3)), m.group(4)
        paths = _paths(args)
        if call in ("openat", "open") and paths and paths[-1] in (begin, end):
            counting = paths[-1] == begin
            continue
        if ret < 0:
            continue
        tally = counting
        if call in ("openat", "open", "creat"):
            if "O_TMPFILE" in args and ret_path and inside(ret_path):
                unnamed = f"/proc/self/fd/{ret}"
                if names.drop(unnamed) and tally:  # the fd's earlier unnamed file was closed without a name
                    freed += 1
                names.create(unnamed)
                if tally:
                    created += 1
            elif ("O_CREAT" in args or call == "creat") and ret_path and inside(ret_path):
                if names.create(os.path.normpath(ret_path)) and tally:
                    created += 1
        elif call in ("mkdir", "mkdirat"):
            if paths and inside(paths[-1]) and names.create(paths[-1]) and tally:
                created += 1
        elif call in ("link", "linkat"):
            if len(paths) == 2 and inside(paths[1]):
                names.link(paths[0], paths[1])
                if paths[0].startswith("/proc/self/fd/"):
                    names.drop(paths[0])  # named: its fd number no longer stands for it
        elif call in ("rename", "renameat", "renameat2"):
            if len(paths) == 2 and inside(paths[1]) and names.rename(paths[0], paths[1]) and tally:
                freed += 1
        elif call in ("unlink", "unlinkat", "rmdir"):
            if paths and inside(paths[-1]) and names.drop(paths[-1]) and tally:
                freed += 1
        elif call in ("fsync", "fdatasync"):
            fd = _FD_ARG.match(args)
            if fd and inside(os.path.normpath(fd.group(2))) and tally:
                fsyncs += 1
    return Counts(inodes_created=created, inodes_freed=freed, fsyncs=fsyncs)
