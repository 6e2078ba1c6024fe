"""Waiting out a host that has no file descriptor left, where a settled child's last steps need the store.

A host process shares its descriptor limit with the application around it (its sockets, its
files). When that runs out for a moment, a store call fails with ``SESSION_UNAVAILABLE`` flagged
``out_of_descriptors`` (``EMFILE``, ``ENFILE``): nothing is wrong with the session's files. Failing
then cost what cannot be had again: a child's settlement notice was dropped for good, its lease
left held until the host closed, and a driver that could not read its child's mailbox settled the
child as failed although its turn had completed. Those steps, each safe to try again (a failed
open wrote nothing), are tried again with backoff for a bounded time instead.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable, TypeVar

import anyio

from subagents.store.errors import SubagentError

__all__ = ["out_of_descriptors", "outlasting"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# how long a step waits for descriptors to come back before it fails as before
WAIT_S = 30.0
FIRST_DELAY_S = 0.01
MAX_DELAY_S = 0.5


def out_of_descriptors(exc: BaseException) -> bool:
    """Whether ``exc`` says only that the process had no descriptor left (see the module docstring)."""
    return isinstance(exc, SubagentError) and exc.fields.get("out_of_descriptors") is True


async def outlasting(step: Callable[[], Awaitable[T]], what: str) -> T:
    """``await step()``, tried again while it fails for want of descriptors, for up to ``WAIT_S``; then
    its error. ``what`` names the step in the one warning logged while it waits."""
    deadline = anyio.current_time() + WAIT_S
    delay, warned = FIRST_DELAY_S, False
    while True:
        try:
            return await step()
        except SubagentError as exc:
            if not out_of_descriptors(exc) or anyio.current_time() + delay > deadline:
                raise
            if not warned:
                log.warning("%s waits: this process has no file descriptor left (%s)", what, exc.message)
                warned = True
        await anyio.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_S)
