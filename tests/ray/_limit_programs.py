"""Programs of the pool-contract tests at the store's limits (``test_pool_store_limits.py``), importable by
a local worker and a Ray actor alike, without the tests' own imports."""

from __future__ import annotations

import os

from subagents.worker.context import TurnContext
from subagents.worker.programs.script import _hold

MESSAGE_BYTES = 65536


async def says_then_floods(ctx: TurnContext) -> str:
    """Says its pid, waits until the file its message names exists, then says ten 64 KiB messages."""
    await ctx.say(str(os.getpid()))
    await _hold(ctx.text)
    for _ in range(10):
        await ctx.say("m" * MESSAGE_BYTES)
    return "done"


async def sized(ctx: TurnContext) -> str:
    """An output of as many characters as its message says."""
    return "r" * int(ctx.text)
