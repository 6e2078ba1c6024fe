"""Tokens that settle who has a turn handed to a worker: the worker that starts it, or the pool that takes it back.

A turn handed to a worker that is then stopped (SIGSTOP, a debugger), or was stopped right after it last
spoke, waited there while another worker idled: asking it back (``Withdraw``) needs an answer a stopped
process cannot give, and nothing on the pipe says whether the worker began it just before it was stopped
(a turn handed to a free slot sends nothing as it starts; one handed ahead sends ``Started``, which may not
be written yet). So the pool makes an empty folder, the turn's token, as it hands the turn over
(``PoolTokens``) and names it in the ``RunTurn``; whoever removes it first has the turn (``rmdir`` succeeds
once): the worker, before it starts the turn, gives it back or ends it unstarted (``take``), or the pool,
taking it back from a worker it reads as stopped (``PoolTokens.revoke``). A worker that finds its token gone
drops that copy of the turn unstarted and says nothing: the pool has it, and may hand it over again, to this
worker too, under a new token. So a turn runs once, wherever it was when the worker was stopped.

Tokens live in a folder of the pool's on a memory file system (``/dev/shm``: a make and a remove cost a few
microseconds each; on a disk, hundreds). Not guaranteed: where there is none, or a worker cannot see it
(checked once, at its start, through a first token it takes), its turns carry no token, and a turn handed
to it waits for it when it is stopped, as every turn it already started does. The cost: a ``mkdir`` and an
``rmdir`` per turn, about 10 µs together. A folder is named for its host (pid and start time); one left by
a host that died without closing its pool (``kill -9``) is removed by the next pool that starts. A worker
whose token's folder is gone (removed so, wrongly) starts the turn: the pool can no longer take it back.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import tempfile

from subagents.store.lease import process_start_time

__all__ = ["PoolTokens", "take"]

log = logging.getLogger(__name__)

# where the pool's tokens live: a memory file system, or none
_MEMORY_FS = "/dev/shm"
# a pool's folder there: its host's pid and start time, then mkdtemp's letters
_PREFIX = "subagents-tokens-"
_FOLDER = re.compile(re.escape(_PREFIX) + r"(\d+)-(\d+)-\w+")


def take(token: str) -> bool:
    """The worker's side: whether it has the turn whose token this is (False: the pool took it back first).
    A token it cannot remove for another reason (which the pool could not either) is taken as its own."""
    try:
        os.rmdir(token)
    except FileNotFoundError:
        return not os.path.isdir(os.path.dirname(token))  # its folder gone, no pool can take it back
    except OSError as exc:
        log.warning("could not take the token %s (%s); the turn is taken as this worker's", token, exc)
    return True


class PoolTokens:
    """The pool's side: one folder of tokens, each made for one hand-over; touched on the pool's event loop only."""

    def __init__(self) -> None:
        self._folder: str | None = None
        self._numbers = itertools.count(1)
        if os.path.isdir(_MEMORY_FS):
            _remove_left()
            try:
                host = os.getpid()
                self._folder = tempfile.mkdtemp(prefix=f"{_PREFIX}{host}-{process_start_time(host)}-", dir=_MEMORY_FS)
            except OSError as exc:
                log.info("no folder for turn tokens in %s (%s): a stopped worker keeps the turns handed ahead to it", _MEMORY_FS, exc)

    def issue(self) -> str | None:
        """A new token, or None when none can be made (the turn is handed over without one)."""
        if self._folder is None:
            return None
        token = os.path.join(self._folder, str(next(self._numbers)))
        try:
            os.mkdir(token)
        except OSError:
            return None
        return token

    def revoke(self, token: str) -> bool:
        """Take the turn back from its worker: True only if its token was still there (the worker never took it)."""
        try:
            os.rmdir(token)
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Remove the folder and the tokens left in it (turns that ended with the pool, or with a dead worker)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def _remove_left() -> None:
    """Remove the token folders of hosts no longer running (another user's stay: not ours to remove)."""
    try:
        names = os.listdir(_MEMORY_FS)
    except OSError:
        return
    for name in names:
        match = _FOLDER.fullmatch(name)
        if match is not None and process_start_time(int(match[1])) != int(match[2]):
            log.info("removing %s, left by a host that is gone", name)
            shutil.rmtree(os.path.join(_MEMORY_FS, name), ignore_errors=True)
