"""``ChangeWatch``: another process's writes and renames of a file a writer keeps open, seen through inotify.

Real files, real writes from a child process (a different process is what the
watch is for), real renames; no timestamps involved.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from subagents.store.changes import ChangeWatch

pytestmark = pytest.mark.skipif(ChangeWatch.open() is None, reason="no inotify here: writers compare timestamps")


@pytest.fixture
def watch():
    made = ChangeWatch.open()
    yield made
    made.close()


@pytest.fixture
def held(tmp_path):
    path = tmp_path / "mailbox"
    path.write_bytes(b"\0" * 4096)
    fd = os.open(path, os.O_RDWR)
    yield path, fd
    os.close(fd)


def other_process(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_own_writes_settled_are_no_change_and_another_process_s_write_in_place_is(watch, held):
    path, fd = held
    watched = watch.watch(fd)
    assert not watch.changed(watched)
    os.pwrite(fd, b"mine", 0)
    assert watch.changed(watched)  # unsettled: the count moved
    watch.settle(watched)
    assert not watch.changed(watched)
    other_process(f"import os; fd = os.open({str(path)!r}, os.O_RDWR); os.pwrite(fd, b'X', 100)")
    assert watch.changed(watched)
    assert watch.changed(watched)  # asking again changes nothing: only a settle does
    watch.settle(watched)
    assert not watch.changed(watched)


@pytest.mark.parametrize("how", ["truncate", "unlink", "rename-away", "renamed-over", "hard-link", "rewrite-whole"])
def test_every_way_another_program_can_touch_the_file_or_its_name_is_a_change(watch, held, how):
    path, fd = held
    other = path.with_name("other")
    other.write_bytes(b"another file")
    watched = watch.watch(fd)
    code = {
        "truncate": f"import os; os.truncate({str(path)!r}, 10)",
        "unlink": f"import os; os.unlink({str(path)!r})",
        "rename-away": f"import os; os.rename({str(path)!r}, {str(path) + '.gone'!r})",
        "renamed-over": f"import os; os.rename({str(other)!r}, {str(path)!r})",
        "hard-link": f"import os; os.link({str(path)!r}, {str(path) + '.link'!r})",
        "rewrite-whole": f"open({str(path)!r}, 'wb').write(b'\\0' * 4096)",  # same size, same inode
    }[how]
    other_process(code)
    assert watch.changed(watched)


def test_two_writers_of_one_file_share_the_kernel_s_watch_until_the_last_lets_go(watch, held):
    path, fd = held
    second_fd = os.open(path, os.O_RDWR)
    try:
        first, second = watch.watch(fd), watch.watch(second_fd)
        assert first.wd == second.wd
        os.pwrite(second_fd, b"b", 0)
        assert watch.changed(first)  # the other writer's write is another hand's for this one
        watch.settle(second)
        assert not watch.changed(second)
        watch.unwatch(second)
        watch.unwatch(second)  # idempotent: the first writer's watch stays
        watch.settle(first)
        other_process(f"import os; fd = os.open({str(path)!r}, os.O_RDWR); os.pwrite(fd, b'X', 9)")
        assert watch.changed(first)
        watch.unwatch(first)
        other_process(f"import os; fd = os.open({str(path)!r}, os.O_RDWR); os.pwrite(fd, b'Y', 9)")
        again = watch.watch(fd)  # a new kernel watch: what happened before it is not its business
        assert not watch.changed(again)
    finally:
        os.close(second_fd)


def test_a_full_event_queue_makes_every_watched_file_count_as_changed(watch, tmp_path):
    """The kernel drops events past ``max_queued_events`` and says so once: nothing is known, so all changed."""
    limit = int(open("/proc/sys/fs/inotify/max_queued_events").read())
    if limit > 100_000:
        pytest.skip(f"max_queued_events is {limit}: too many writes to overflow in a test")
    fds = []
    for name in ("a", "b", "quiet"):
        (tmp_path / name).write_bytes(b"\0" * 16)
        fds.append(os.open(tmp_path / name, os.O_RDWR))
    try:
        a, b, quiet = (watch.watch(fd) for fd in fds)
        for _ in range(limit // 2 + 8):  # alternating files: identical consecutive events would be merged
            os.pwrite(fds[0], b"a", 0)
            os.pwrite(fds[1], b"b", 0)
        assert watch.changed(quiet)  # never written, but its events may be among those dropped
        watch.settle(quiet)
        assert not watch.changed(quiet)
    finally:
        for fd in fds:
            os.close(fd)


def test_a_closed_watch_sees_every_file_as_changed_and_watches_no_more(watch, held):
    _, fd = held
    watched = watch.watch(fd)
    watch.close()
    watch.close()
    assert watch.changed(watched)
    assert watch.watch(fd) is None
    watch.unwatch(watched)  # after close: nothing to remove, no error
