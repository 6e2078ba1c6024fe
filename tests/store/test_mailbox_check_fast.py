"""A message's record is checked by exact types, not by its pydantic model, on every acceptance and read.

Found profiling a followup's acceptance (``benchmarks/followup.py``): every
acceptance ran ``MailboxFields.model_validate`` on its record (``_refuse``)
and every read of a mailbox on each record, a few microseconds each on the
store thread. A record of the exact types a writer writes passes a quick
test; only one that does not gets the model's verdict and text, so the
verdicts are the model's in every case.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from subagents import store
from subagents.store.ids import IdGenerator
from subagents.store.mailbox import MailboxWriter
from subagents.store.records import MailboxFields, mailbox_problem, validate

from ._support import CONTINUABLE, make_child


def test_messages_are_accepted_and_read_without_the_model(st, monkeypatch) -> None:
    """A held writer's acceptances and the readers' ``pending`` never ask the model about a valid message."""
    store.create_session(st, "p")
    make_child(st, "p", "c", descriptor=CONTINUABLE)
    ids = IdGenerator()
    writer = MailboxWriter(st, "c")
    try:
        writer.accept(source={"kind": "user"}, content="first", ids=ids)  # the writer's first acceptance reads the file

        def refused(*_args: object, **_kwargs: object) -> None:
            raise AssertionError("a valid message record was checked by its pydantic model")

        monkeypatch.setattr(MailboxFields, "model_validate", refused)
        for n in range(3):
            writer.accept(source={"kind": "user"}, content=f"message {n}", ids=ids, wake=n % 2 == 0)
        texts = [m.content for m in store.pending(st, "c", consumed=0, last_consumed_id=None)]
    finally:
        writer.close()
    assert texts == ["first", "message 0", "message 1", "message 2"]


VALID = {"seq": 0, "id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "ts": 1.5, "source": {"kind": "user"}, "content": "hi", "wake": True}


class Text(str):
    """A ``str`` subclass: not what a writer writes, judged by the model."""


# values of every kind a decoded record (or a caller's record) may hold in each field
ODD = hst.one_of(
    hst.none(), hst.booleans(), hst.integers(min_value=-(2**70), max_value=2**70), hst.integers(min_value=10**300, max_value=10**400),
    hst.floats(allow_nan=True, allow_infinity=True), hst.text(max_size=3), hst.builds(Text, hst.text(max_size=3)),
    hst.binary(max_size=3), hst.lists(hst.integers(), max_size=2),
    hst.dictionaries(hst.one_of(hst.text(max_size=2), hst.integers(), hst.builds(Text, hst.text(max_size=2))), hst.integers(), max_size=2),
)
MISSING = object()


@settings(max_examples=400, deadline=None)
@given(hst.dictionaries(hst.sampled_from(sorted(VALID) + ["extra"]), hst.one_of(ODD, hst.just(MISSING)), max_size=4))
def test_the_quick_check_gives_the_models_verdict_and_text(changes: dict[str, object]) -> None:
    """Any record, valid or not: ``mailbox_problem`` says what ``MailboxFields`` says, in its words."""
    record = {**VALID}
    for key, value in changes.items():
        if value is MISSING:
            record.pop(key, None)
        else:
            record[key] = value
    verdict = validate(MailboxFields, record)
    assert mailbox_problem(record) == (verdict if isinstance(verdict, str) else None)


@pytest.mark.parametrize("ts", [0.0, -1.0, 1e308, 1, math.inf, -math.inf, math.nan, True, 10**400])
def test_timestamps_at_the_edges_get_the_models_verdict(ts: object) -> None:
    record = {**VALID, "ts": ts}
    verdict = validate(MailboxFields, record)
    assert mailbox_problem(record) == (verdict if isinstance(verdict, str) else None)
