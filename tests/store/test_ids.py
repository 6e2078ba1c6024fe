"""Session ids: syntax checked before any path is built; generated ids sort in creation order."""

from __future__ import annotations

import os
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from subagents import store
from subagents.store.ids import SESSION_ID_PATTERN, _encode

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ID_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_-"


@pytest.mark.parametrize(
    "bad",
    ["../x", "a/b", "", "x" * 65, ".", "..", "-a", "_a", "a b", "a.b", "a\x00b", "é", "a/", "/a", "a\\b", "a\n", 7, None, b"ab", ["a"]],
)
def test_validate_rejects(bad):
    """Traversal, separators, empty, too long, a bad first character and non-str are refused."""
    with pytest.raises(store.InvalidSessionIdError) as info:
        store.validate_session_id(bad)
    assert info.value.code == "INVALID_SESSION_ID"
    assert isinstance(info.value, ValueError)
    assert not store.is_valid_session_id(bad)


@pytest.mark.parametrize("good", ["a", "0", "x" * 64, "A-b_c", "01HZY3K5Q9", "s1-child_2"])
def test_validate_accepts(good):
    """Ids of 1..64 characters from the alphabet, starting alphanumeric, are returned unchanged."""
    assert store.validate_session_id(good) == good


def test_paths_refuse_bad_ids(st):
    """The store never builds a path from a bad id."""
    for call in (lambda: st.session_path("../x"), lambda: st.path("a/b", "mailbox"), lambda: st.owner_path(""),
                 lambda: st.children_index_path("..")):
        with pytest.raises(store.InvalidSessionIdError):
            call()
    with pytest.raises(store.InvalidSessionIdError):
        store.create_session(st, "../escape")
    assert os.listdir(st.sessions_dir) == []


def test_generator_ids_sort_in_creation_order():
    """Thousands of ids from one generator (many per millisecond) are strictly increasing."""
    ids = store.IdGenerator()
    made = [ids.new() for _ in range(5000)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    assert all(len(i) == 26 and store.is_valid_session_id(i) for i in made)


def _millis(session_id: str) -> int:
    value = 0
    for char in session_id[:10]:
        value = value * 32 + CROCKFORD.index(char)
    return value


def test_new_id_is_valid_and_time_prefixed():
    """new_id and generated ids are valid 26-character ids whose first 10 characters are the Unix ms."""
    now_ms = time.time() * 1000
    for made in (store.new_id(), store.IdGenerator().new()):
        assert store.is_valid_session_id(made) and len(made) == 26
        assert abs(_millis(made) - now_ms) < 5000


@settings(max_examples=300, deadline=None)
@given(hs.integers(min_value=0, max_value=2**50 - 1), hs.integers(min_value=0, max_value=2**80 - 1))
def test_an_id_spells_its_millisecond_and_random_bits(ms, rand):
    """The 26 characters are the Crockford base-32 digits of the ms (10) then of the random bits (16)."""
    made = _encode(ms, rand)
    digits = [CROCKFORD.index(char) for char in made]
    assert len(made) == 26
    assert sum(d << (5 * (9 - i)) for i, d in enumerate(digits[:10])) == ms
    assert sum(d << (5 * (15 - i)) for i, d in enumerate(digits[10:])) == rand


def test_generators_are_independent():
    """Two generators keep no shared state (no module-global counter)."""
    g1, g2 = store.IdGenerator(), store.IdGenerator()
    x = [g1.new() for _ in range(100)]
    y = [g2.new() for _ in range(100)]
    assert x == sorted(x) and y == sorted(y)
    assert not set(x) & set(y)


@settings(max_examples=300, deadline=None)
@given(hs.text(max_size=70))
def test_validity_matches_the_pattern(text):
    """Validity is exactly a full match of ^[0-9A-Za-z][0-9A-Za-z_-]{0,63}$."""
    expected = re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z_-]{0,63}", text) is not None and "\n" not in text
    assert store.is_valid_session_id(text) == expected
    if expected:
        assert store.validate_session_id(text) == text
    else:
        with pytest.raises(store.InvalidSessionIdError):
            store.validate_session_id(text)


@settings(max_examples=200, deadline=None)
@given(hs.text(alphabet=ID_ALPHABET, min_size=1, max_size=64))
def test_valid_alphabet_ids(text):
    """Any id drawn from the alphabet is valid iff its first character is alphanumeric."""
    assert store.is_valid_session_id(text) == text[0].isalnum()
    assert SESSION_ID_PATTERN.fullmatch(text) is not None or not text[0].isalnum()


def test_a_forked_generator_draws_a_new_seed():
    """A generator inherited through fork must not repeat its parent's ids (the PRNG is reseeded)."""
    gen = store.IdGenerator()
    gen.new()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one id, then out without running pytest's teardown
        try:
            time.sleep(0.002)  # a new millisecond, so the id takes fresh random bits
            os.write(write, gen.new().encode())
        finally:
            os._exit(0)
    os.close(write)
    time.sleep(0.002)
    mine = gen.new()
    theirs = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert len(theirs) == 26 and mine[10:] != theirs[10:]
