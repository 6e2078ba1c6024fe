"""A creation that finds no file descriptor left says so, and which limit to raise (found by the
resource-limits probe: ``DURABILITY_FAILED: creating session ... failed: Too many open files`` read like a
disk fault, while the disk and the store were sound and the same call succeeds once descriptors are back)."""

from __future__ import annotations

import errno
import os
import resource

import pytest

from subagents import store
from subagents.store.errors import DurabilityError


def test_a_creation_out_of_descriptors_names_the_open_file_limit(tmp_path) -> None:
    st = store.Store(tmp_path / "store")
    store.create_session(st, "r")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    try:
        while True:  # every descriptor this process may still open, taken
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        with pytest.raises(DurabilityError) as caught:
            store.create_session(st, "c", parent_session="r", origin="subagent")
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "ulimit -n" in str(caught.value), str(caught.value)
    assert caught.value.fields.get("out_of_descriptors") is True, caught.value.fields
    assert not st.exists("c")
    store.create_session(st, "c", parent_session="r", origin="subagent")  # descriptors back: it succeeds
    assert [e.id for e in store.read_children(st, "r")] == ["c"]
