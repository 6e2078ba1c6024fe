"""Whether the worker an open turn runs on is stopped (SIGSTOP, Ctrl-Z): the listings say so beside its node.

A stopped worker stalls its turns and writes nothing, so the store alone shows
such a turn as one that runs long: ``running``, its ``turn`` time growing. When
the node is a local worker of this host (``<host>:<pid>``, as the local pool
writes it; a Ray node's ``<ip>/<id>:<pid>`` never matches), its process state
in ``/proc`` says whether it is stopped, and ``show`` and ``top`` say so with
what ends it: ``kill -CONT`` resumes it; an interrupt, a drain or the
supervisor's close kill it after the cancel grace.
"""

from __future__ import annotations

import socket

__all__ = ["node_text", "stopped_worker"]


def stopped_worker(node: str | None) -> int | None:
    """The pid of the local worker ``node`` names when that process is stopped now, else None."""
    if not node:
        return None
    host, _, pid = node.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    from subagents.worker.descendants import stopped  # here: it reads leases, which --help never needs

    return int(pid) if stopped(int(pid)) else None


def node_text(node: str | None, *, long: bool) -> str | None:
    """``node`` as a listing shows it: with ``(stopped ...)`` after it when its worker is stopped."""
    pid = stopped_worker(node)
    if pid is None:
        return node
    if not long:
        return f"{node} (stopped)"
    return f"{node} (stopped: its turn stalls until `kill -CONT {pid}`; an interrupt kills it after the cancel grace)"
