"""``echo``: answers with its message. The cheapest real program."""

from __future__ import annotations

from ..context import TurnContext

__all__ = ["echo"]


async def echo(ctx: TurnContext) -> str:
    await ctx.step()
    return ctx.text
