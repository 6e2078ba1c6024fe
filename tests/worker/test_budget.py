"""``TurnControl``: the first stop cause wins; steps count against ``max_steps``."""

from __future__ import annotations

import pytest

from subagents.worker import BudgetExhaustedError, TurnControl, TurnStopped

# TurnControl holds an anyio CancelScope, which needs a running event loop
pytestmark = pytest.mark.anyio


async def test_first_cause_wins():
    control = TurnControl(max_steps=None)
    assert control.stop("aborted", "cancelled") is True
    assert control.stop("budget-exhausted", "timer") is False
    assert (control.cause, control.diagnostic) == ("aborted", "cancelled")
    assert control.stopping
    assert control.scope.cancel_called


async def test_timer_first_is_not_rewritten_by_a_later_cancel():
    control = TurnControl(max_steps=None)
    assert not control.stopping
    control.stop("budget-exhausted", "the turn exceeded timeout_ms=5")
    control.stop("aborted", "late")
    assert control.cause == "budget-exhausted"


async def test_check_raises_once_stopped():
    control = TurnControl(max_steps=None)
    control.check()
    control.stop("aborted")
    with pytest.raises(TurnStopped) as info:
        control.check()
    assert info.value.cause == "aborted"


async def test_steps_count_up_to_the_budget():
    control = TurnControl(max_steps=2)
    assert [control.count_step(), control.count_step()] == [1, 2]
    with pytest.raises(BudgetExhaustedError) as info:
        control.count_step()
    assert info.value.code == "BUDGET_EXHAUSTED"
    assert (control.cause, control.diagnostic) == ("budget-exhausted", "the turn exceeded max_steps=2")
    with pytest.raises(TurnStopped):
        control.count_step()


async def test_unlimited_steps():
    control = TurnControl(max_steps=None)
    for _ in range(1000):
        control.count_step()
    assert control.steps == 1000 and control.cause is None
