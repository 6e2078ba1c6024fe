"""A worker acts on a turn handed ahead with a token only once it has taken the token; a copy whose token
the pool took back first (the worker was stopped) is dropped, unstarted and unanswered, and a newer copy of
the same turn is the one that runs, is given back or is cancelled. So a turn the pool took back runs once.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from subagents.worker.claims import PoolTokens
from subagents.worker.protocol import Cancel, RunTurn, Shutdown, TurnDone, Withdraw, Withdrawn

from .test_main import DEADLINE_S, event_types, held, peer, received, session, wait_for_turn_start  # noqa: F401 (peer: a fixture)


@pytest.fixture
def tokens():
    made = PoolTokens()
    try:
        yield made
    finally:
        made.close()


def one_running(peer, tmp_path):
    peer.recv()
    gate = tmp_path / "gate"
    peer.send(RunTurn(call_id=1, spec=held(tmp_path, "01FIRST", gate)))
    wait_for_turn_start(tmp_path, "01FIRST")
    return gate


def ahead(tmp_path, tokens: PoolTokens) -> tuple[RunTurn, str]:
    token = tokens.issue()
    assert token is not None, "no memory file system for tokens here"
    return RunTurn(call_id=2, spec=session(tmp_path, "01AHEAD", "echo", "next"), queued=True, token=token), token


def test_a_turn_whose_token_the_worker_took_runs_and_can_no_longer_be_taken_back(peer, tmp_path, tokens):
    gate = one_running(peer, tmp_path)
    msg, token = ahead(tmp_path, tokens)
    peer.send(msg)
    gate.touch()
    assert received(peer, 3) == [("TurnDone", 1), ("Started", 2), ("TurnDone", 2)]
    assert not tokens.revoke(token) and not os.path.exists(token)


def test_a_turn_taken_back_first_is_dropped_unstarted_and_unanswered(peer, tmp_path, tokens):
    gate = one_running(peer, tmp_path)
    msg, token = ahead(tmp_path, tokens)
    peer.send(msg)
    assert tokens.revoke(token)
    gate.touch()
    assert received(peer, 1) == [("TurnDone", 1)]
    assert not peer.conn.poll(0.3), "a turn taken back never runs here"
    assert event_types(tmp_path, "01AHEAD") == []


@pytest.mark.parametrize("ask", ["withdraw", "cancel", "start"])
def test_a_newer_copy_of_a_turn_taken_back_is_the_one_acted_on(peer, tmp_path, tokens, ask: str) -> None:
    """The pool took the turn back, then handed it ahead to this worker again: the stale copy, first in the
    worker's line, is passed over; a withdraw gives back, a cancel ends, a free slot starts the newer one."""
    gate = one_running(peer, tmp_path)
    stale, stale_token = ahead(tmp_path, tokens)
    peer.send(stale)
    assert tokens.revoke(stale_token)
    newer = dataclasses.replace(stale, token=tokens.issue())  # the same turn, handed ahead again
    peer.send(newer)
    if ask == "withdraw":
        peer.send(Withdraw(call_id=2))
        assert peer.recv() == Withdrawn(call_id=2)
    elif ask == "cancel":
        peer.send(Cancel(call_id=2, reason="user"))
        done = peer.recv()
        assert (type(done), done.call_id, done.outcome.stop_reason) == (TurnDone, 2, "aborted")
    gate.touch()
    if ask == "start":
        assert received(peer, 3) == [("TurnDone", 1), ("Started", 2), ("TurnDone", 2)]
        assert event_types(tmp_path, "01AHEAD").count("turn/start") == 1
    else:
        assert received(peer, 1) == [("TurnDone", 1)]
        assert event_types(tmp_path, "01AHEAD") == []
    assert not peer.conn.poll(0.3), "nothing more: the stale copy is never answered"


def test_shutdown_ends_only_the_turns_ahead_still_the_workers(peer, tmp_path, tokens):
    one_running(peer, tmp_path)  # its gate never opens
    msg, token = ahead(tmp_path, tokens)
    peer.send(msg)
    assert tokens.revoke(token)
    peer.send(Shutdown())
    assert received(peer, 1) == [("TurnDone", 1)]
    peer.process.join(DEADLINE_S)
    assert peer.process.exitcode == 0
