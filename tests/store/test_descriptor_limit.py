"""A process out of file descriptors gets a ``SubagentError``, never a bare ``OSError``.

Found by a probe: with a host's open-file limit nearly used up (an application's own sockets),
``start_continuable`` raised ``OSError: [Errno 24] Too many open files: '.../sessions'``: the fsync
of a folder opened it outside the conversion its fsync had.
"""

from __future__ import annotations

import os
import resource

import pytest

from subagents import store
from subagents.store.atomic import fsync_dir


@pytest.fixture
def few_descriptors():
    """Every descriptor of this process in use, under a soft limit lowered to 512 (cheap to fill)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
    held: list[int] = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_folder_fsync_with_no_descriptor_left_is_a_durability_failure(tmp_path, few_descriptors) -> None:
    with pytest.raises(store.DurabilityError) as caught:
        fsync_dir(str(tmp_path))
    assert "Too many open files" in caught.value.message
