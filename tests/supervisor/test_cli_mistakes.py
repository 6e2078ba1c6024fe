"""Ordinary mistakes through the real ``subagents`` CLI: an ``error: CODE: message`` line, never a traceback (issue #13).

Each test runs the CLI as a subprocess on a store in ``tmp_path`` and checks
the exit code, the code on stderr, and that nothing was written when the
command refused. Read-only stores are made with a read-only bind mount in a
private mount namespace (``unshare -m``): the tests run as root, and root
writes through file modes, but not through a read-only mount.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from subagents import store
from subagents.store import Store, create_session
from subagents.store.session_file import HEADER_AT

DEADLINE_S = 90.0
FAST = {**{k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_") and k != "PYTHONPATH"}, "SUBAGENTS_DURABILITY": "none"}
CLI = [sys.executable, "-m", "subagents.supervisor.cli"]


def cli(*args: str, cwd: Path, prefix: tuple[str, ...] = (), **kwargs: object) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([*prefix, *CLI, *args], cwd=cwd, env=FAST, capture_output=True, text=True,
                              timeout=DEADLINE_S, **kwargs)  # type: ignore[call-overload]
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"subagents {' '.join(args)} hung; stdout={exc.stdout!r} stderr={exc.stderr!r}")


def refused(done: subprocess.CompletedProcess[str], code: str) -> str:
    """The one ``error: CODE: ...`` line of a refusal (exit 2, no traceback); returns its message."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "INTERNAL" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {code}: "), done.stderr
    return lines[0][len(f"error: {code}: "):]


def _family(tmp_path: Path, *, described: bool = False) -> tuple[Path, str, str]:
    """A store holding a root and one continuable-looking child of it (headers only; ``described``: the
    child's log opens with a continuable descriptor, so that listings read it as a sound child, not a
    damaged one, which ``drain`` names as one it could not drain)."""
    path = tmp_path / "st"
    st = Store(path, durability="none")
    root, child = store.new_id(), store.new_id()
    create_session(st, root, events=[("approval/policy", {"policy": "never", "source": "test"})])
    events = [("subagent/descriptor", {"version": 1, "mode": "continuable", "provider": "echo", "label": "c"})] if described else []
    create_session(st, child, parent_session=root, origin="subagent", delegation_depth=1, events=events)
    return path, root, child


# -- the store path ----------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", [["run", "echo"], ["demo", "--quick"]])
@pytest.mark.parametrize("where", ["file", "file/sub"])
def test_a_file_as_the_store_is_refused(tmp_path: Path, verb: list[str], where: str) -> None:
    """run / demo with --store naming a file (or a folder below a file) say so, and create nothing."""
    (tmp_path / "file").write_text("not a store\n")
    message = refused(cli("--store", where, *verb, cwd=tmp_path), "STORE_FORMAT")
    assert "file" in message
    assert sorted(os.listdir(tmp_path)) == ["file"] and (tmp_path / "file").read_text() == "not a store\n"


def test_a_folder_without_a_store_says_how_to_make_one(tmp_path: Path) -> None:
    """A folder with no store: 'there is no store at PATH', and how to make one; never 'no STORE marker'."""
    (tmp_path / "empty").mkdir()
    for folder in ("empty", "missing"):
        message = refused(cli("--store", folder, "ls", cwd=tmp_path), "STORE_NOT_FOUND")
        assert f"there is no store at {tmp_path / folder}" in message
        assert "subagents demo" in message and "--store" in message and "STORE marker" not in message
    assert not (tmp_path / "missing").exists() and os.listdir(tmp_path / "empty") == []


@pytest.fixture
def without_dac_override() -> tuple[str, ...]:
    """A command prefix that runs the CLI as root without the capabilities that pass every permission bit, so a
    folder of mode 000 keeps it out as it keeps out another user."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to drop the capabilities that pass permission bits")
    return ("setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search")


@pytest.mark.parametrize("mode", [0o000, 0o444])
@pytest.mark.parametrize("verb", [["store", "migrate"], ["store", "check"], ["ls"]])
def test_a_store_this_process_may_not_enter_is_unreadable_for_migrate_as_for_every_verb(
        tmp_path: Path, without_dac_override: tuple[str, ...], mode: int, verb: list[str]) -> None:
    """Found by a probe: ``store migrate`` of a store folder of mode 000 said ``OS_ERROR: [Errno 13] ...`` (and of mode
    444, which lists but cannot be entered, that it was no store) where every other verb says STORE_UNREADABLE."""
    path, _root, _child = _family(tmp_path)
    os.chmod(path, mode)
    try:
        message = refused(cli("--store", str(path), *verb, cwd=tmp_path, prefix=without_dac_override), "STORE_UNREADABLE")
    finally:
        os.chmod(path, 0o755)
    assert message.startswith(f"the store at {path} cannot be read by this process (Permission denied"), message


def _read_only_mount_works(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    done = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {probe} {probe} && mount -o remount,ro,bind {probe} && "
                           f"! touch {probe}/x 2>/dev/null"], capture_output=True)
    shutil.rmtree(probe)
    return done.returncode == 0


@pytest.fixture
def read_only(tmp_path: Path) -> tuple[str, ...]:
    """A command prefix that runs the CLI with ``tmp_path/st`` bind-mounted read-only (private mount namespace)."""
    if shutil.which("unshare") is None or not _read_only_mount_works(tmp_path):
        pytest.skip("cannot make a read-only bind mount here (needs unshare -m and mount)")
    st = tmp_path / "st"
    return ("unshare", "-m", "sh", "-c", f'mount --bind {st} {st} && mount -o remount,ro,bind {st} && exec "$@"', "sh")


@pytest.mark.parametrize("verb", ["run", "demo", "send", "interrupt", "drain", "reindex", "repair"])
def test_a_read_only_store_is_named_as_such(tmp_path: Path, read_only: tuple[str, ...], verb: str) -> None:
    """Every verb that writes answers STORE_READ_ONLY on a read-only store: no ExceptionGroup, no traceback."""
    path, root, child = _family(tmp_path)
    args = {
        "run": ["run", "echo", "--prompt", "hi"],
        "demo": ["demo", "--quick"],
        "send": ["send", child, "hello", "--parent", root],
        "interrupt": ["interrupt", child, "--parent", root],
        "drain": ["drain", root],
        "reindex": ["store", "reindex"],
        "repair": ["store", "fsck", "--repair"],
    }[verb]
    message = refused(cli("--store", "st", *args, cwd=tmp_path, prefix=read_only), "STORE_READ_ONLY")
    assert f"the store at {path} is read-only" in message
    # the read verbs still work on it
    listed = cli("--store", "st", "ls", root, cwd=tmp_path, prefix=read_only)
    assert listed.returncode == 0, listed.stderr


# -- programs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("program", ["nosuch", "nosuch.module:fn", "os:nosuch_function"])
def test_run_of_an_unknown_program_fails_before_anything_is_written(tmp_path: Path, program: str) -> None:
    """run PROGRAM resolves the program first: PROGRAM_LOAD_FAILED, and no root or child session is written."""
    Store(tmp_path / "st", durability="none")
    message = refused(cli("--store", "st", "run", program, cwd=tmp_path), "PROGRAM_LOAD_FAILED")
    assert program in message
    assert os.listdir(tmp_path / "st" / "sessions") == []


def test_run_of_a_prompt_larger_than_the_store_takes_writes_nothing(tmp_path: Path) -> None:
    """RECORD_TOO_LARGE before the root is made: it was refused as the child was created, after
    ``run`` had made its root, and an empty root was left behind (found by a probe)."""
    Store(tmp_path / "st", durability="none", max_record_bytes=4096)  # kept in the store's marker
    done = cli("--store", "st", "run", "echo", "--prompt", "-", cwd=tmp_path, input="x" * 5000)
    message = refused(done, "RECORD_TOO_LARGE")
    assert message.startswith('a "message/accepted" event of ') and message.endswith(
        "bytes exceeds the store's record size limit of 4096 bytes (max_record_bytes)"), message
    assert os.listdir(tmp_path / "st" / "sessions") == []


def test_demo_ray_address_without_the_ray_pool_is_a_usage_error(tmp_path: Path) -> None:
    """``--ray-address`` was ignored without ``--pool ray``: the demo ran on the local pool, saying nothing
    (found by a probe). Refused before the store is made."""
    message = refused(cli("--store", "st", "demo", "--quick", "--ray-address", "127.0.0.1:6379", cwd=tmp_path), "USAGE")
    assert message == '--ray-address joins a Ray cluster, and the pool is "local": add --pool ray', message
    assert not (tmp_path / "st").exists()


def test_run_loads_a_program_from_the_current_folder(tmp_path: Path) -> None:
    """`subagents run myprog:hello` from the folder holding myprog.py works without PYTHONPATH, as `python -m` does."""
    (tmp_path / "myprog.py").write_text(textwrap.dedent(
        """
        async def hello(ctx):
            return "hello from myprog"
        """
    ))
    script = Path(sys.executable).with_name("subagents")
    command = [str(script)] if script.exists() else CLI
    done = subprocess.run([*command, "--store", "st", "run", "myprog:hello"], cwd=tmp_path, env=FAST,
                          capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.splitlines()[0] == "hello from myprog"


# -- ids -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["ls", "tree"])
def test_listing_an_unknown_id_is_session_not_found(tmp_path: Path, verb: str) -> None:
    """ls / tree of an id with no session: SESSION_NOT_FOUND, not an empty '(no subagents)'."""
    _family(tmp_path)
    refused(cli("--store", "st", verb, "01NOSUCHSESSION", cwd=tmp_path), "SESSION_NOT_FOUND")


BAD_IDS = ["../../etc", "sp ace", "é", "x" * 5000]


@pytest.mark.parametrize("bad", BAD_IDS, ids=["dotdot", "space", "unicode", "long"])
def test_malformed_ids_are_invalid_session_id_and_echoed_short(tmp_path: Path, bad: str) -> None:
    """Every verb that takes an id refuses a malformed one with INVALID_SESSION_ID, echoing at most a short prefix."""
    _, root, child = _family(tmp_path)
    for args in (["ls", bad], ["tree", bad], ["show", bad], ["log", bad], ["drain", bad],
                 ["send", bad, "hi", "--parent", root], ["send", child, "hi", "--parent", bad],
                 ["interrupt", bad, "--parent", root], ["interrupt", child, "--parent", bad]):
        message = refused(cli("--store", "st", *args, cwd=tmp_path), "INVALID_SESSION_ID")
        assert len(message) < 200, (args[0], message)


@pytest.mark.parametrize("verb", ["send", "interrupt"])
def test_control_of_an_unknown_child_is_session_not_found(tmp_path: Path, verb: str) -> None:
    """send / interrupt to a well-formed id with no session: SESSION_NOT_FOUND, before any supervisor starts."""
    _, root, _ = _family(tmp_path)
    args = ["send", "01NOSUCHCHILD", "hi", "--parent", root] if verb == "send" else ["interrupt", "01NOSUCHCHILD", "--parent", root]
    refused(cli("--store", "st", *args, cwd=tmp_path), "SESSION_NOT_FOUND")
    assert os.listdir(tmp_path / "st" / "owners") == []  # no supervisor registered


# -- pipes and signals -----------------------------------------------------------------------------


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`subagents tree | head -1`: no BrokenPipeError traceback, nothing on stderr (like `git log | head`)."""
    path, root, _ = _family(tmp_path)
    st = Store(path, durability="none")
    for _ in range(300):  # more output than a pipe buffer holds
        create_session(st, store.new_id(), parent_session=root, origin="subagent", delegation_depth=1)
    done = subprocess.run(["bash", "-c", 'set -o pipefail; "$@" | head -1', "sh", *CLI, "--store", "st", "tree"],
                          cwd=tmp_path, env=FAST, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.stdout.count("\n") == 1
    assert done.stderr == ""
    assert done.returncode in (0, 141)


def test_a_closed_pipe_under_a_running_supervisor_ends_quietly(tmp_path: Path) -> None:
    """`subagents demo --quick | head -1`: the pipe closes while the demo's supervisor is open. Found by a probe:
    it ended 141 but printed `WARNING subagents.supervisor.service: None` on stderr, a warning about nothing."""
    done = subprocess.run(["bash", "-c", 'set -o pipefail; "$@" | head -1', "sh", *CLI, "--store", "st", "demo", "--quick"],
                          cwd=tmp_path, env=FAST, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.stdout.startswith("demo root ") and done.stdout.count("\n") == 1, done.stdout
    assert done.stderr == ""
    assert done.returncode == 141


def test_a_refusal_whose_message_spans_lines_is_still_one_line(tmp_path: Path) -> None:
    """Found by a probe: a program module whose import raised a two-line error made `run` print
    `error: PROGRAM_LOAD_FAILED: ... RuntimeError: line1` and then `line2` alone; a refusal is one line, its
    control characters escaped as a label's are in a table."""
    (tmp_path / "raiser.py").write_text('raise RuntimeError("line1\\nline2\\x1b[31m")\n')
    message = refused(cli("--store", "st", "run", "raiser:main", cwd=tmp_path), "PROGRAM_LOAD_FAILED")
    assert message.endswith("RuntimeError: line1\\nline2\\x1b[31m"), message
    assert not (tmp_path / "st").exists()


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("verb", ["log", "top"])
def test_ctrl_c_stops_follow_and_top_even_when_sigint_was_ignored(tmp_path: Path, verb: str) -> None:
    """log --follow and top stop on SIGINT even when started with SIGINT ignored (`trap '' INT` in the shell)."""
    _, root, _ = _family(tmp_path)
    args = ["log", root, "--follow"] if verb == "log" else ["top", "--interval", "0.2"]
    proc = subprocess.Popen([*CLI, "--store", "st", *args], cwd=tmp_path, env=FAST, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline()  # running: it has printed its first line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _damage_header(st_path: Path, session_id: str) -> None:
    """Overwrite the middle of a session's header (its CRC then fails): the damage ``store fsck`` reports."""
    path = Store(st_path, create=False).session_path(session_id)
    raw = bytearray(Path(path).read_bytes())
    start = HEADER_AT
    end = int.from_bytes(raw[4:8], "little")
    middle = (start + end) // 2
    raw[middle:middle + 4] = b"\xff\xfe\xfd\xfc"
    Path(path).write_bytes(bytes(raw))


@pytest.mark.parametrize("verb", ["ls", "tree", "summary", "drain"])
def test_a_parent_whose_header_is_damaged_still_lists_its_children(tmp_path: Path, verb: str) -> None:
    """The listing of a parent reads its children index, not its header: a damaged header is named on
    stderr (a warning, exit 0) and the children are still listed, so they can be found and rescued."""
    path = tmp_path / "st"
    assert cli("run", "echo", "--prompt", "hi", "--store", str(path), cwd=tmp_path).returncode == 0
    st = Store(path, create=False)
    [root] = [r.id for r in store.list_roots(st)]
    [child] = [c.id for c in store.list_children(st, root)]
    _damage_header(path, root)
    done = cli(verb, root, "--json", "--store", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    [warning] = done.stderr.strip().splitlines()
    assert warning.startswith("warning: CORRUPT_SESSION: ") and root in warning, warning
    if verb == "summary":
        assert json.loads(done.stdout)["subagents"] == 1, done.stdout
    elif verb == "drain":  # its one child is a finished one-shot: nothing to tear down, and no refusal
        assert json.loads(done.stdout)["root"] == root, done.stdout
    else:
        assert [row["id"] for row in json.loads(done.stdout)] == [child], done.stdout


# -- usage -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["ls", "--bogus"], "unrecognized arguments: --bogus (see `subagents ls --help`)"),
    (["bogusverb"], "argument COMMAND: invalid choice: 'bogusverb' (choose from "),
    (["store", "fsck", "--nope"], "unrecognized arguments: --nope (see `subagents store fsck --help`)"),
    (["ls", "--limit", "many"], "argument --limit: 'many' is not a whole number"),
    (["send"], "the following arguments are required: "),
])
def test_a_usage_error_is_one_error_line_with_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    """Issue d: argparse's usage block and 'subagents: error: ...' became 'error: USAGE: message', exit 2."""
    text = refused(cli(*args, cwd=tmp_path), "USAGE")
    assert text.startswith(message), text
    assert os.listdir(tmp_path) == []


def test_ctrl_c_in_a_terminal_stops_the_turn_as_aborted_not_as_a_crash(tmp_path: Path) -> None:
    """Found by a probe: a terminal's Ctrl-C (SIGINT to the whole foreground process group) reached the workers
    too, which exited at once: `worker N died: exited with code 0`, and the turn was closed by crash repair
    (`interrupted`). The workers ignore SIGINT; the supervisor alone takes it and stops the turn (`aborted`)."""
    proc = subprocess.Popen([*CLI, "--store", "st", "run", "script", "--prompt", '{"script": [{"say": "up"}, {"sleep": 60000}]}'],
                            cwd=tmp_path, env=FAST, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as a shell gives a foreground job
    try:
        st = tmp_path / "st"
        deadline = time.monotonic() + DEADLINE_S
        child = None
        while child is None and time.monotonic() < deadline:
            try:
                ids = Store(st, create=False).session_ids()
                child = next((i for i in ids if any(e["type"] == "assistant/message" for e in store.inspect(Store(st, create=False), i).events)), None)
            except store.SubagentError:
                pass
            time.sleep(0.05)
        assert child is not None, "the turn never started"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert "died" not in err, err
        ends = [e["data"] for e in store.inspect(Store(st, create=False), child).events if e["type"] == "turn/end"]
        assert [e["stop_reason"] for e in ends] == ["aborted"], ends
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_top_offers_only_the_statuses_it_can_show(tmp_path: Path) -> None:
    """Found by a probe: ``top --help`` offered ``--status complete``, a filter that always printed nothing (top lists
    running and idle sessions only). It is a usage error now, and the help offers running and idle."""
    path, _root, _child = _family(tmp_path)
    text = refused(cli("--store", str(path), "top", "--once", "--status", "complete", cwd=tmp_path), "USAGE")
    assert "--status is one of running, idle" in text, text
    assert "only these statuses: running, idle" in cli("top", "--help", cwd=tmp_path).stdout.replace("\n", " ").replace("  ", " ")


@pytest.mark.parametrize("value", ["inf", "1e300", "1e-300", "0.01", "86401", "nan", "-1", "0"])
def test_top_refuses_an_interval_it_cannot_wait_or_that_would_spin(tmp_path: Path, value: str) -> None:
    """Found by a probe: ``top --interval inf`` (or ``1e300``) printed one snapshot, then an OverflowError traceback
    from ``time.sleep`` and INTERNAL; ``1e-300`` redrew in a busy loop. Now a usage error naming the bounds, which
    the help gives too (``nan`` is no number, as with every option that takes one)."""
    path, _root, _child = _family(tmp_path)
    text = refused(cli("--store", str(path), "top", "--interval", value, cwd=tmp_path), "USAGE")
    assert ("'nan' is not a number" if value == "nan" else "must be from 0.05 to 86400 seconds (a day)") in text, text
    assert "0.05 to 86400 (a day)" in cli("top", "--help", cwd=tmp_path).stdout.replace("\n", " ").replace("  ", " ")


@pytest.mark.parametrize("wait_s", ["inf", "1e300"])
def test_drain_may_wait_without_limit(tmp_path: Path, wait_s: str) -> None:
    """``--wait-s`` of ``send`` and ``drain`` takes inf (no limit): a deadline that far is no sleep that overflows."""
    path, root, _child = _family(tmp_path, described=True)
    done = cli("--store", str(path), "drain", root, "--wait-s", wait_s, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["settled"] is True


@pytest.mark.parametrize("argv, shown", [
    (["send", "01M8MW1K3J5T0000000000000B", "x", "--parent", "01M8MVY0PZ9RKY15DPNHER70WX", "--wait-s", "abc"], "argument --wait-s: 'abc' is not a number"),
    (["demo", "--children", "many"], "argument --children: 'many' is not a whole number"),
    (["ls", "--limit", "1.5"], "argument --limit: '1.5' is not a whole number"),
    (["top", "--interval", "soon"], "argument --interval: 'soon' is not a number"),
])
def test_a_number_that_is_not_one_is_named_as_such(tmp_path: Path, argv: list[str], shown: str) -> None:
    """Found by a probe: ``--wait-s abc`` said ``invalid positive_float value: 'abc'``, naming a function of the
    parser, not what the option takes."""
    assert refused(cli(*argv, cwd=tmp_path), "USAGE").startswith(f"{shown} (see `subagents ")


_CHILD, _ROOT = "01M8MW1K3J5T0000000000000B", "01M8MVY0PZ9RKY15DPNHER70WX"
_WAITS = {"send": ["send", _CHILD, "x", "--parent", _ROOT], "drain": ["drain", _ROOT], "interrupt": ["interrupt", _CHILD, "--parent", _ROOT]}


@pytest.mark.parametrize("verb", sorted(_WAITS))
@pytest.mark.parametrize("wait_s, shown", [
    ("nan", "'nan' is not a number"),
    ("-1", "must be a number of seconds, {range}"),
])
def test_every_wait_s_refuses_the_same_mistake_in_the_same_words(tmp_path: Path, verb: str, wait_s: str, shown: str) -> None:
    """Found by a probe: ``send --wait-s nan`` said "must be more than 0" where ``interrupt --wait-s nan`` said
    "must be a finite number of seconds, at least 0". A NaN is no number (as ``abc`` is not), and a number out
    of range is told the range of its verb in the same words (``interrupt`` takes 0, ``send`` and ``drain`` inf)."""
    ranges = {"interrupt": "finite, 0 or more", "send": "more than 0 (inf: no limit)", "drain": "more than 0 (inf: no limit)"}
    expected = f"argument --wait-s: {shown.format(range=ranges[verb])} (see `subagents {verb} --help`)"
    assert refused(cli(*_WAITS[verb], "--wait-s", wait_s, cwd=tmp_path), "USAGE") == expected
