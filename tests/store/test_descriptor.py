"""Descriptors: strict validation, and the two folds (resume first-own, identity last-wins)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from subagents import store
from subagents.store.descriptor import identity_of
from subagents.store.projection import Projection

from ._support import CONTINUABLE, ONE_SHOT, event

PREFIX = "persisted subagent descriptor "
FULL = {**CONTINUABLE, "agent_provider": "openai", "agent_model": "m1", "persona": "terse",
        "tool_filter": {"allow": ["read"], "deny": ["rm"]}}


def test_valid_one_shot_and_continuable_roundtrip():
    """Valid payloads parse to their models and to_record gives the payload back."""
    one = store.parse_descriptor(ONE_SHOT)
    assert isinstance(one, store.OneShotDescriptor) and one.to_record() == ONE_SHOT
    assert store.parse_descriptor({"version": 1, "mode": "one-shot", "provider": "p"}).label is None
    full = store.parse_descriptor(FULL)
    assert isinstance(full, store.ContinuableDescriptor) and full.to_record() == FULL
    assert full.tool_filter == store.ToolFilter(allow=("read",), deny=("rm",))
    assert store.DESCRIPTOR_VERSION == 1


@pytest.mark.parametrize(
    "payload, message",
    [
        ("text", "payload must be an object"),
        (None, "payload must be an object"),
        ([1], "payload must be an object"),
        ({"mode": "one-shot", "provider": "p"}, "version must be a number"),
        ({**ONE_SHOT, "version": "1"}, "version must be a number"),
        ({**ONE_SHOT, "version": 1.0}, "version must be a number"),
        ({**ONE_SHOT, "version": True}, "version must be a number"),
        ({**ONE_SHOT, "mode": "forever"}, 'mode must be "one-shot" or "continuable"'),
        ({"version": 1, "provider": "p"}, 'mode must be "one-shot" or "continuable"'),
        ({**ONE_SHOT, "extra": 1}, 'payload has unknown field "extra"'),
        ({**ONE_SHOT, "persona": "x"}, 'payload has unknown field "persona"'),
        ({**CONTINUABLE, "subagent_depth": 2}, 'payload has unknown field "subagent_depth"'),
        ({**CONTINUABLE, "tool_filter": {"allow": [], "other": []}}, 'payload has unknown field "tool_filter.other"'),
        ({"version": 1, "mode": "one-shot"}, "provider must be a string"),
        ({"version": 1, "mode": "continuable", "provider": "p"}, "label must be a string"),
    ],
)
def test_malformed_payloads(payload, message):
    """Each malformed payload raises DescriptorError with its exact message."""
    with pytest.raises(store.DescriptorError) as info:
        store.parse_descriptor(payload)
    assert str(info.value) == PREFIX + message
    assert info.value.code == "INVALID_DESCRIPTOR" and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "payload, where",
    [
        ({**ONE_SHOT, "provider": 5}, "provider"),
        ({**ONE_SHOT, "label": 5}, "label"),
        ({**CONTINUABLE, "label": None}, "label"),
        ({**CONTINUABLE, "agent_model": 1}, "agent_model"),
        ({**CONTINUABLE, "agent_provider": ["x"]}, "agent_provider"),
        ({**CONTINUABLE, "persona": b"x"}, "persona"),
        ({**CONTINUABLE, "tool_filter": {}}, "tool_filter"),
        ({**CONTINUABLE, "tool_filter": {"allow": None, "deny": None}}, "tool_filter"),
        ({**CONTINUABLE, "tool_filter": "all"}, "tool_filter"),
        ({**CONTINUABLE, "tool_filter": {"allow": "read"}}, "tool_filter.allow"),
        ({**CONTINUABLE, "tool_filter": {"deny": [1]}}, "tool_filter.deny"),
    ],
)
def test_wrong_types_are_errors(payload, where):
    """Strict types: a wrong type anywhere is a DescriptorError naming the field."""
    with pytest.raises(store.DescriptorError) as info:
        store.parse_descriptor(payload)
    assert str(info.value).startswith(PREFIX + where)


def test_tool_filter_needs_allow_or_deny():
    """A filter declaring neither is refused; allow and deny combine."""
    with pytest.raises(store.DescriptorError, match="toolFilter must declare allow and/or deny"):
        store.parse_descriptor({**CONTINUABLE, "tool_filter": {}})
    with pytest.raises(ValueError):
        store.ToolFilter()
    both = store.ToolFilter(allow=("a", "b"), deny=("b",))
    assert [both.permits(n) for n in ("a", "b", "c")] == [True, False, False]
    deny_only = store.ToolFilter(deny=("x",))
    assert deny_only.permits("y") and not deny_only.permits("x")
    assert store.ToolFilter(allow=()).permits("a") is False


@pytest.mark.parametrize(
    "payload, message",
    [
        ({**ONE_SHOT, "label": None}, "label must be a string"),
        ({**CONTINUABLE, "persona": None}, "persona must be a string"),
        ({**CONTINUABLE, "agent_provider": None}, "agent_provider must be a string"),
        ({**CONTINUABLE, "agent_model": None}, "agent_model must be a string"),
        ({**CONTINUABLE, "tool_filter": None}, "tool_filter must be an object"),
        ({**CONTINUABLE, "tool_filter": {"allow": ["a"], "deny": None}}, "tool_filter.deny must be an array of strings"),
        ({**ONE_SHOT, "persona": None}, 'payload has unknown field "persona"'),
        ({**CONTINUABLE, "label": None, "extra": None}, 'payload has unknown field "extra"'),
        ({**CONTINUABLE, "provider": 5, "extra": 1}, 'payload has unknown field "extra"'),
    ],
)
def test_nil_optional_fields_are_malformed(payload, message):
    """Absent optional fields are omitted, never nil (docs/behaviour.md, "Descriptors"): an explicit nil is malformed,
    so the catalog lists such a child as corrupt instead of guessing what was meant."""
    with pytest.raises(store.DescriptorError) as info:
        store.parse_descriptor(payload)
    assert str(info.value) == PREFIX + message
    assert identity_of(payload) == "corrupt"


@pytest.mark.parametrize("version", [0, 2, 99, -1])
def test_unknown_version_is_none(version):
    """An int version other than 1 is unsupported: None, not an error, whatever else is in it."""
    assert store.parse_descriptor({"version": version, "anything": ["goes"]}) is None
    assert identity_of({"version": version}) == "unsupported"


def test_identity_of_verdicts():
    """The identity fold maps a payload to a descriptor, 'corrupt' or 'unsupported'."""
    assert identity_of(ONE_SHOT) == store.parse_descriptor(ONE_SHOT)
    assert identity_of({"version": 1, "mode": "one-shot"}) == "corrupt"
    assert identity_of("x") == "corrupt"
    assert identity_of({"version": 99}) == "unsupported"


# -- folds ---------------------------------------------------------------------

A = {**ONE_SHOT, "label": "ancestor"}
B = {**CONTINUABLE, "label": "own"}
C = {**CONTINUABLE, "label": "later"}
BAD = {"version": 1, "mode": "continuable", "provider": "p"}
V99 = {"version": 99}


def descriptors(*payloads):
    return [event(i, "subagent/descriptor", p) for i, p in enumerate(payloads)]


def fold(events, seed_length=0):
    p = Projection(seed_length=seed_length)
    for i, e in enumerate(events):
        p.apply(e, i, i + 1)
    return p


def test_resume_takes_the_first_descriptor_after_the_seed():
    """Resume ignores seeded descriptors and takes the first own one, not the last."""
    events = descriptors(A, B, C)
    assert store.fold_resume_descriptor(events, 1) == (1, store.parse_descriptor(B))
    assert store.fold_resume_descriptor(events, 0) == (0, store.parse_descriptor(A))
    assert store.fold_resume_descriptor(events, 3) is None
    p = fold(events, seed_length=1)
    assert (p.resume_seq, p.resume) == (1, store.parse_descriptor(B))
    assert p.continuable() == store.parse_descriptor(B)


def test_resume_of_a_fork_with_only_a_seeded_descriptor_is_none():
    """A fork child whose only descriptor is in its seed has nothing to resume."""
    events = descriptors(A) + [event(1, "session/end-seed"), event(2, "turn/start")]
    assert store.fold_resume_descriptor(events, 1) is None
    p = fold(events, seed_length=1)
    assert p.resume is None and not p.resume_seen
    assert p.identity == store.parse_descriptor(A)  # the catalog lists it under the ancestor identity


def test_resume_first_own_unsupported_or_malformed():
    """An unsupported first own descriptor means no resume; a malformed one raises / records the error."""
    assert store.fold_resume_descriptor(descriptors(V99, B), 0) is None
    p = fold(descriptors(V99, B))
    assert p.resume is None and p.resume_seen and p.resume_error is None
    with pytest.raises(store.DescriptorError):
        store.fold_resume_descriptor(descriptors(BAD, B), 0)
    p = fold(descriptors(BAD, B))
    assert p.resume is None and p.resume_error == PREFIX + "label must be a string"


def test_identity_is_last_wins_and_resets():
    """Identity: the last descriptor wins; malformed resets to corrupt, unknown version to unsupported."""
    assert fold(descriptors(A, B)).identity == store.parse_descriptor(B)
    assert fold(descriptors(A, B)).identity_seq == 1
    assert fold(descriptors(A, BAD)).identity == "corrupt"
    assert fold(descriptors(A, V99)).identity == "unsupported"
    assert fold(descriptors(BAD, A)).identity == store.parse_descriptor(A)
    assert fold([event(0, "turn/start")]).identity is None


payload_kinds = hs.sampled_from(["A", "B", "C", "BAD", "V99", "other"])
PAYLOADS = {"A": A, "B": B, "C": C, "BAD": BAD, "V99": V99}


@settings(max_examples=200, deadline=None)
@given(hs.lists(payload_kinds, max_size=8), hs.integers(0, 8))
def test_projection_folds_agree_with_the_rules(kinds, seed_length):
    """For any mix of events, the projection's resume equals fold_resume_descriptor and identity is last-wins."""
    events = [
        event(i, "subagent/descriptor", PAYLOADS[k]) if k != "other" else event(i, "assistant/message")
        for i, k in enumerate(kinds)
    ]
    p = fold(events, seed_length)
    own = [k for k in kinds[seed_length:] if k != "other"]
    if own and own[0] == "BAD":
        with pytest.raises(store.DescriptorError):
            store.fold_resume_descriptor(events, seed_length)
        assert p.resume is None and p.resume_error is not None
    else:
        expected = store.fold_resume_descriptor(events, seed_length)
        assert (None if expected is None else expected[1]) == p.resume
        if expected is not None:
            assert expected[0] == p.resume_seq
    descs = [k for k in kinds if k != "other"]
    if not descs:
        assert p.identity is None
    else:
        assert p.identity == identity_of(PAYLOADS[descs[-1]])
    assert Projection.from_record(p.to_record()) == p
