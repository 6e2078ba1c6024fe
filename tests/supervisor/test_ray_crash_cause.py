"""The cause of a Ray worker actor's death, as the turn's diagnostic and the listings say it.

Found by a Ray probe: after a node loss no ``ActorDiedError`` came within the pool's deadline, and the
diagnostic was Ray's ``ActorUnavailableError`` text ("The actor is temporarily unavailable: RpcError ...")
cut at 300 characters in the middle of a word: a dead node said to be temporarily away. (Pure functions:
no cluster needed.)
"""

from __future__ import annotations

from subagents.supervisor.ray_pool import crash_cause, unanswered_cause


def test_a_long_cause_is_cut_at_a_word_and_says_so() -> None:
    text = "The actor died in a way nobody foresaw: " + " ".join(f"word{n}" for n in range(200))
    cause = crash_cause(RuntimeError(text))
    assert len(cause) <= 300 and cause.endswith("…")
    assert cause[:-1].rstrip().split()[-1] in text.split()


def test_an_actor_that_stopped_answering_is_said_to_have_been_killed_unanswering() -> None:
    cause = unanswered_cause(5.0)
    assert "temporarily" not in cause
    assert cause == ("it stopped answering for 5 s without Ray declaring it dead (its node lost, or cut off from "
                     "this host), and the pool killed it")
