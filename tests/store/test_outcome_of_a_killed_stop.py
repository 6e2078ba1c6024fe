"""A turn whose worker was killed for ignoring a stop reads as that stop, not as a crash.

Crash repair closes such a turn ``interrupted`` with the stop's ``cause`` (store/events.py ``closers``);
its caller was told ``aborted`` (``the turn was cancelled (CAUSE); worker process N killed ...``), and
the listing said ``interrupted``, "the turn was interrupted by a crash" (found by a probe). Any cause
reads ``aborted`` (``drain``: ``drained``), in the caller's words; a worker that died on its own, with
no stop asked, still reads ``interrupted``.
"""

from __future__ import annotations

import pytest

from subagents import store
from subagents.store.events import closers
from subagents.store.outcome import outcome_of

from ._support import make_child

KILLED = "worker process 1234 killed by signal SIGKILL"


@pytest.mark.parametrize(
    ("cause", "outcome", "error"),
    [
        ("user", "aborted", f"the turn was cancelled (user); {KILLED}"),
        ("parent", "aborted", f"the turn was cancelled (parent); {KILLED}"),
        ("disposed", "aborted", f"the turn was cancelled (disposed); {KILLED}"),
        ("drain", "drained", f"the turn was cancelled (drain); {KILLED}"),
        (None, "interrupted", f"the turn was interrupted by a crash ({KILLED})"),
    ],
)
def test_a_repaired_turn_reads_as_the_stop_it_ignored(st, cause: str | None, outcome: str, error: str) -> None:
    store.create_session(st, "p")
    make_child(st, "p", "c")
    with store.LogWriter.open(st, "c", epoch=0) as writer:
        writer.append([("turn/start", {}), *closers(1, None, {}, cause=cause, crash=KILLED)], commit=True)
    verdict = outcome_of(store.read_projection(st, "c"), held=False)
    assert (verdict.outcome, verdict.error) == (outcome, error)
