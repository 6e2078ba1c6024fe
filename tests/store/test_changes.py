"""``ChangeWatch``: another process's writes and renames of a file a writer keeps open, seen through inotify;
and a mailbox writer held open with it, against every kind of touch another hand can make.

Real files, real writes (from a child process where a different process is
the point), real renames; no timestamps involved.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from subagents import store
from subagents.store.changes import ChangeWatch
from subagents.store.mailbox import MailboxWriter

from ._support import CONTINUABLE, read_file

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


TOOLS = {  # util-linux and coreutils: bytes zeroed in place without a write(2), and a write around the page cache
    "punch-hole": lambda path: ["fallocate", "--punch-hole", "--offset", "0", "--length", "4096", str(path)],
    "zero-range": lambda path: ["fallocate", "--zero-range", "--offset", "100", "--length", "200", str(path)],
    "direct-io": lambda path: ["dd", "if=/dev/zero", f"of={path}", "bs=4096", "count=1", "conv=notrunc", "oflag=direct",
                               "status=none"],
}


@pytest.mark.parametrize("how", list(TOOLS))
def test_bytes_changed_in_place_by_a_tool_are_a_change(watch, held, how):
    path, fd = held
    command = TOOLS[how](path)
    if shutil.which(command[0]) is None:
        pytest.skip(f"no {command[0]} here")
    watched = watch.watch(fd)
    done = subprocess.run(command, capture_output=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"{command[0]} cannot do this here: {done.stderr.decode().strip()}")  # e.g. O_DIRECT on tmpfs
    assert watch.changed(watched)


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


OPS = ["accept", "accept", "another-writer", "touch", "damage", "repair", "replace", "relink"]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=hst.lists(hst.sampled_from(OPS), min_size=1, max_size=16), seed=hst.integers(0, 2**32 - 1))
def test_a_watched_writer_never_acknowledges_a_message_beside_damage_another_hand_made(tmp_path_factory, ops, seed):
    """Whatever another hand does between a held writer's acceptances — writes the same bytes back,
    damages a queued message in place and repairs it, appends through another writer of the store,
    puts a copy in the mailbox's place, moves its name and back — the writer refuses exactly while a
    queued message is damaged (changing nothing), and every message it acknowledged reads back."""
    rng = random.Random(seed)
    st = store.Store(tmp_path_factory.mktemp("watched") / "store", durability="none")
    store.create_session(st, "s1", events=[("subagent/descriptor", CONTINUABLE)])
    path = st.path("s1", "mailbox")
    watch = ChangeWatch.open()
    writer = MailboxWriter(st, "s1", changes=watch)
    ids = store.IdGenerator()
    accepted: list[str] = []
    damage: tuple[int, bytes] | None = None  # (offset, the byte that was there)
    try:
        for number, op in enumerate(["accept", *ops]):
            content = f"m{number}"
            if op in ("accept", "another-writer"):
                before = read_file(path) if os.path.exists(path) else None
                if damage is not None:
                    with pytest.raises(store.CorruptSessionError):
                        if op == "accept":
                            writer.accept(source={}, content=content, ids=ids)
                        else:
                            store.accept(st, "s1", source={}, content=content, ids=ids)
                    assert read_file(path) == before
                else:
                    if op == "accept":
                        writer.accept(source={}, content=content, ids=ids)
                    else:
                        store.accept(st, "s1", source={}, content=content, ids=ids)
                    accepted.append(content)
            elif op == "touch":
                with open(path, "r+b") as handle:
                    first = handle.read(1)
                    handle.seek(0)
                    handle.write(first)  # the same byte: touched, not changed
            elif op == "damage" and damage is None:
                ends = [0] + [m.end for m in store.read_mailbox(st, "s1")]
                which = rng.randrange(len(ends) - 1)
                offset = rng.randrange(ends[which] + 8, ends[which + 1])  # past the frame's header: its CRC fails
                original = read_file(path)[offset:offset + 1]
                with open(path, "r+b") as handle:
                    handle.seek(offset)
                    handle.write(bytes([original[0] ^ 0x5A]))
                damage = (offset, original)
            elif op == "repair" and damage is not None:
                with open(path, "r+b") as handle:
                    handle.seek(damage[0])
                    handle.write(damage[1])
                damage = None
            elif op == "replace":
                copy = path + ".copy"
                with open(copy, "wb") as handle:
                    handle.write(read_file(path))
                os.rename(copy, path)
            elif op == "relink":
                os.link(path, path + ".link")
                os.unlink(path)
                os.rename(path + ".link", path)
        if damage is not None:
            with open(path, "r+b") as handle:
                handle.seek(damage[0])
                handle.write(damage[1])
        assert [m.content for m in store.read_mailbox(st, "s1")] == accepted
    finally:
        writer.close()
        watch.close()
