"""One damage case over a small healthy store, and every read that must survive it (issue #14).

``build`` makes the store: a root ``r`` with three subagent children ``c1``
(one-shot, finished), ``c2`` (continuable: mailbox, control record, lease of a
live owner ``o1``) and ``c3`` (the usual target, with a grandchild ``g1``, its
own mailbox, control file, identity cache and lease, both lease slots used).
``damage`` applies one ``Damage`` to one file kind: a companion file, a
region of c3's session file (its preamble, both lease slots, the newest slot
alone, its header, its log), the session file as a whole, or a creation's
leftover temporary file beside it; ``read_everything`` calls every read API
and returns the problems found (an empty list is a pass):

* an exception other than a ``SubagentError`` from a call allowed to refuse,
  or any exception from a call that promises never to raise;
* a healthy sibling hidden or changed by another session's damage;
* a byte, mode or mtime changed by a read;
* a leftover temporary file listed as a session;
* the newest lease slot torn (random bytes, cut, a flipped bit) and the
  epoch of the acquisition in the other slot not read back.

``tests/store/test_damage_properties.py`` drives it with hypothesis; run as a
script it counts cases tried and failures found (``python tests/store/_damage_cases.py N``).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import os
import random
import shutil
import stat
import sys
import struct
import tempfile
import traceback
import zlib
from typing import Any, Callable

import msgpack

from subagents import store
from subagents.store.framing import FRAME, encode_record, scan
from subagents.store.session_file import HEADER_AT, SLOT_SIZE, SLOTS_AT

# regions of c3's session file (``store/session_file.py``); "session" is the file as a whole and
# "leftover" a creation's temporary file of c3 beside it; the rest are files of their own
REGIONS = ("preamble", "lease", "lease-slot", "header", "log")
KINDS = ("STORE", *REGIONS, "session", "leftover", "mailbox", "control", "identity", "owner", "index", "parent-index")
# the damages of a name rather than of bytes: for a region they apply to the session file
NODE_HOWS = ("folder", "link-loop", "link-out", "fifo", "missing")
LEFTOVER = ".c3.new.4242.0badf00d"
HOWS = ("random-bytes", "truncate", "flip", "wrong-type", "folder", "link-loop", "link-out", "fifo", "missing")
# values of the wrong type for any field: what a CRC-valid hostile record can hold
WEIRD = [float("inf"), float("-inf"), float("nan"), -1, 2**63, -(2**63), 2**64 - 1, 1.5, "", "x", "not a number", [1, 2, 3],
         ["turn/end"], {"a": 1}, {}, None, True, False, b"\x00\xff", 0]

ONE_SHOT = {"version": 1, "mode": "one-shot", "provider": "p", "label": "one"}
CONTINUABLE = {"version": 1, "mode": "continuable", "provider": "p", "label": "two"}
TURN = [("turn/start", {}), ("assistant/message", {"text": "done"}), ("turn/end", {"stop_reason": "completed"})]


@dataclasses.dataclass(frozen=True)
class Damage:
    kind: str  # one of KINDS
    how: str  # one of HOWS
    seed: int  # drives every random choice of the damage
    data: bytes = b""  # the random bytes, when how == "random-bytes"

    def __str__(self) -> str:
        return f"{self.how} of {self.kind} (seed {self.seed}, {len(self.data)} bytes)"


def build(root: str) -> store.Store:
    st = store.Store(os.path.join(root, "store"), durability="none")
    ids = store.IdGenerator()
    store.create_session(st, "r", created_at=1.0, label="root")
    store.create_session(st, "c1", parent_session="r", origin="subagent", created_at=2.0,
                         events=[("subagent/descriptor", ONE_SHOT), ("message/accepted", {"message_id": "m0", "content": "hi"}), *TURN])
    store.create_session(st, "c2", parent_session="r", origin="subagent", created_at=3.0,
                         events=[("subagent/descriptor", CONTINUABLE), ("session/end-seed", {})], lease_owner="o1")
    store.register_owner(st, "o1", ttl=3600.0)
    store.create_session(st, "c3", parent_session="r", origin="subagent", created_at=4.0,
                         events=[("subagent/descriptor", {**CONTINUABLE, "label": "three"}), ("session/end-seed", {})], lease_owner="o3")
    store.register_owner(st, "o3", ttl=3600.0)
    store.create_session(st, "g1", parent_session="c3", origin="subagent", created_at=5.0,
                         events=[("subagent/descriptor", {**ONE_SHOT, "label": "grand"}), *TURN])
    for sid in ("c2", "c3"):
        for text in ("first", "second"):
            store.accept(st, sid, source={"kind": "user"}, content=text, ids=ids)
        store.request(st, sid, "interrupt", {"reason": "user"}, ids=ids)
    with store.LogWriter.open(st, "c3", epoch=1) as writer:
        # a log of CACHE_LAG_BYTES: its commit writes the identity cache (a shorter log has none)
        writer.append([("turn/start", {}), ("message/accepted", {"message_id": "x", "content": "first"}),
                       ("tool/call", {"call_id": "k", "name": "t", "blob": b"\x00" * store.log.CACHE_LAG_BYTES}),
                       ("tool/result", {"call_id": "k"}), ("turn/end", {"stop_reason": "completed"})], commit=True)
    assert os.path.isfile(st.path("c3", "identity"))
    # a state change: the newest slot is not the acquisition's (the "lease-slot" damage tears it)
    store.set_lease_state(st, "c3", "o3", 1, "idle")
    return st


def _path(st: store.Store, kind: str) -> str:
    if kind == "STORE":
        return os.path.join(st.root, "STORE")
    if kind == "owner":
        return st.owner_path("o3")
    if kind == "index":
        return st.children_index_path("c3")
    if kind == "parent-index":
        return st.children_index_path("r")
    if kind == "leftover":
        return os.path.join(st.sessions_dir, LEFTOVER)
    if kind in REGIONS or kind == "session":
        return st.session_path("c3")
    return st.path("c3", kind)


def _span(raw: bytes, kind: str) -> tuple[int, int]:
    """Where a region of a session file's bytes lies: ``(start, end)``."""
    start = struct.unpack_from("<I", raw, 4)[0] if len(raw) >= 8 else len(raw)
    if kind == "preamble":
        return 0, SLOTS_AT
    if kind == "lease":
        return SLOTS_AT, HEADER_AT
    if kind == "lease-slot":
        at = SLOTS_AT + _newest_slot(raw) * SLOT_SIZE
        return at, at + SLOT_SIZE
    if kind == "header":
        return HEADER_AT, start
    return start, len(raw)  # log


def _newest_slot(raw: bytes) -> int:
    """The slot with the highest ``gen`` (the one readers take), as the file's bytes say."""
    gens = []
    for i in (0, 1):
        slot = raw[SLOTS_AT + i * SLOT_SIZE : SLOTS_AT + (i + 1) * SLOT_SIZE]
        length, _ = FRAME.unpack_from(slot)
        record = msgpack.unpackb(slot[FRAME.size : FRAME.size + length], raw=False) if 0 < length < SLOT_SIZE else {}
        gens.append(record.get("gen", -1))
    return 0 if gens[0] > gens[1] else 1


def _damage_region(raw: bytes, case: Damage, rng: random.Random) -> bytes:
    """The session file's bytes with one region damaged as ``case.how`` says."""
    start, end = _span(raw, case.kind)
    region = raw[start:end]
    if case.how == "random-bytes":
        if case.kind in ("lease", "lease-slot"):  # slots are rewritten in place: the same length
            slot = (case.data + bytes(SLOT_SIZE))[:SLOT_SIZE]
            new = slot * (2 if case.kind == "lease" else 1)
        else:
            new = case.data
        return raw[:start] + new + raw[end:]
    if case.how == "truncate":
        if case.kind == "lease-slot":  # a torn slot write: a prefix of it, zeros after
            cut = rng.randrange(SLOT_SIZE)
            return raw[:start] + region[:cut] + bytes(SLOT_SIZE - cut) + raw[end:]
        if case.kind == "log":
            return raw[: start + rng.randrange(len(region) + 1)]
        return raw[: start + rng.randrange(len(region))]  # the file ends inside this region
    if case.how == "flip":
        buf = bytearray(raw)
        at = start + rng.randrange(max(1, len(region)))
        if at >= len(buf):
            buf.append(0)
        buf[at] ^= 1 << rng.randrange(8)
        return bytes(buf)
    # wrong-type: CRC-valid bytes whose content is wrong
    weird = rng.choice(WEIRD)
    if case.kind == "preamble":  # a log start that is a number, just not the right one
        return raw[:4] + struct.pack("<I", rng.choice([0, 8, HEADER_AT, len(raw), 2**32 - 1])) + raw[8:]
    if case.kind in ("lease", "lease-slot"):
        record = {"gen": 9, "owner": "o3", "epoch": 1, "state": "running", "acquired_at": 1.0}
        record[rng.choice(list(record))] = weird
        slot = encode_record(record)[:SLOT_SIZE]
        slot += bytes(SLOT_SIZE - len(slot))
        return raw[:start] + (slot * 2 if case.kind == "lease" else slot) + raw[end:]
    if case.kind == "header":
        head = msgpack.unpackb(raw[HEADER_AT + FRAME.size : end], raw=False)
        value = _wrong_value(head, weird, rng)
        frame = encode_record(value) if isinstance(value, dict) else _frame(msgpack.packb(value, use_bin_type=True))
        return raw[:4] + struct.pack("<I", HEADER_AT + len(frame)) + raw[8:HEADER_AT] + frame + raw[end:]
    return raw[:start] + _wrong_type(region, "log", rng)


def _frame(body: bytes) -> bytes:
    return FRAME.pack(len(body), zlib.crc32(body)) + body


def _wrong_type(raw: bytes, kind: str, rng: random.Random) -> bytes:
    """The file re-encoded with one field (or the whole value) replaced by a value of the wrong type."""
    weird = rng.choice(WEIRD)
    if kind in ("log", "mailbox", "control", "identity", "index", "parent-index"):
        found = scan(raw)
        records = [dict(r) for r in found.records] or [{"seq": 0}]
        i = rng.randrange(len(records))
        keys = [k for k in records[i] if k != "seq"] or ["type"]
        records[i][rng.choice(keys + ["type", "ts", "data"])] = weird
        # (a projection the line above already replaced by an empty map has no field left to replace)
        if kind == "identity" and isinstance(records[0].get("projection"), dict) and records[0]["projection"] and rng.random() < 0.7:
            records = [{"seq": 0, "projection": {**records[0]["projection"], rng.choice(list(records[0]["projection"])): weird}}]
        return b"".join(encode_record(r) for r in records)
    value = _wrong_value(msgpack.unpackb(raw, raw=False) if raw else {}, weird, rng)
    return msgpack.packb(value, use_bin_type=True)


def _wrong_value(value: Any, weird: Any, rng: random.Random) -> Any:
    if isinstance(value, dict) and value and rng.random() < 0.85:
        value = dict(value)
        value[rng.choice(list(value))] = weird
        return value
    return weird


def damage(st: store.Store, case: Damage, outside: str) -> None:
    path = _path(st, case.kind)
    rng = random.Random(case.seed)
    if case.kind == "leftover" and case.how not in NODE_HOWS:
        # a creation that died before its link: what it wrote of a whole file, under its temporary name
        whole = open(st.session_path("c3"), "rb").read()
        open(path, "wb").write({"random-bytes": case.data, "truncate": whole[: rng.randrange(len(whole) + 1)],
                                "flip": whole[:-1] + bytes([whole[-1] ^ 1]), "wrong-type": whole}[case.how])
        return
    if case.kind in REGIONS and case.how not in NODE_HOWS:
        with open(path, "rb") as handle:
            raw = handle.read()
        with open(path, "wb") as handle:
            handle.write(_damage_region(raw, case, rng))
        return
    raw = open(path, "rb").read() if os.path.isfile(path) and not os.path.islink(path) else b""
    if case.how in NODE_HOWS and os.path.lexists(path):
        os.unlink(path)
    if case.kind == "session" and case.how == "wrong-type":
        # a whole, valid session file, of another session (its header names c2)
        open(path, "wb").write(open(st.session_path("c2"), "rb").read())
    elif case.how == "random-bytes":
        open(path, "wb").write(case.data)
    elif case.how == "truncate":
        open(path, "wb").write(raw[: rng.randrange(len(raw) + 1)] if raw else b"")
    elif case.how == "flip":
        buf = bytearray(raw or b"\x00")
        buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        open(path, "wb").write(bytes(buf))
    elif case.how == "wrong-type":
        open(path, "wb").write(_wrong_type(raw, case.kind, rng))
    elif case.how == "folder":
        os.mkdir(path, 0o700)
    elif case.how == "link-loop":
        os.symlink(os.path.basename(path), path)
    elif case.how == "link-out":
        os.symlink(outside, path)
    elif case.how == "fifo":
        os.mkfifo(path, 0o600)


def tree_state(root: str) -> dict[str, tuple[Any, ...]]:
    state: dict[str, tuple[Any, ...]] = {}
    for folder, dirs, files in os.walk(root):
        info = os.lstat(folder)
        state[folder] = ("dir", info.st_mode, info.st_mtime_ns)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            body: Any = None
            if stat.S_ISLNK(info.st_mode):
                body = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                body = open(path, "rb").read()
            state[path] = ("node", info.st_mode, info.st_mtime_ns, body)
    return state


class _Errors(logging.Handler):
    """Collects ERROR records of the store: the catalog's isolation boundary logs a bug there."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _calls(st: store.Store) -> list[tuple[str, Callable[[], Any], bool]]:
    """(name, call, may it refuse with a SubagentError)."""
    from subagents.store.control import read_controls
    from subagents.store.fsck import fsck

    calls: list[tuple[str, Callable[[], Any], bool]] = [
        ("list_children(r)", lambda: store.list_children(st, "r"), False),
        ("list_children(c3)", lambda: store.list_children(st, "c3"), False),
        ("list_descendants(r)", lambda: store.list_descendants(st, "r"), False),
        ("fsck", lambda: fsck(st, repair=False, lease_ttl_s=3600.0), False),
    ]
    for sid in ("r", "c1", "c2", "c3", "g1"):
        calls += [
            (f"inspect({sid})", lambda sid=sid: store.inspect(st, sid), True),
            (f"read_header({sid})", lambda sid=sid: store.read_header(st, sid), True),
            (f"read_lease({sid})", lambda sid=sid: store.read_lease(st, sid), False),
            (f"session_status({sid})", lambda sid=sid: store.session_status(st, sid), False),
            (f"read_mailbox({sid})", lambda sid=sid: store.read_mailbox(st, sid), True),
            (f"read_controls({sid})", lambda sid=sid: read_controls(st, sid), False),
            (f"read_children({sid})", lambda sid=sid: store.read_children(st, sid), False),
            (f"read_projection({sid})", lambda sid=sid: store.read_projection(st, sid), True),
            (f"read_from({sid})", lambda sid=sid: store.read_from(st, sid, 0), True),
        ]
        if hasattr(store, "describe_session"):
            calls.append((f"describe_session({sid})", lambda sid=sid: store.describe_session(st, sid), True))
        if hasattr(store, "check_lease"):
            calls.append((f"check_lease({sid})", lambda sid=sid: store.check_lease(st, sid), True))
    for owner in ("o1", "o3"):
        calls.append((f"read_owner({owner})", lambda owner=owner: store.read_owner(st, owner), False))
    calls.append(("session_ids", st.session_ids, False))
    if hasattr(store, "list_roots"):
        calls.append(("list_roots", lambda: store.list_roots(st), False))
    if hasattr(store, "held_sessions"):
        calls.append(("held_sessions", lambda: store.held_sessions(st), False))
    return calls


def read_everything(st_root: str, case: Damage) -> list[str]:
    """Every read API on the damaged store; the problems found."""
    problems: list[str] = []
    before = tree_state(st_root)
    errors = _Errors()
    logger = logging.getLogger("subagents.store")
    logger.addHandler(errors)
    try:
        try:
            st = store.Store(st_root, durability="none", create=False)
        except store.SubagentError:
            if case.kind != "STORE":
                problems.append("Store(): refused a store whose marker is intact")
            return problems
        except Exception as exc:
            return [f"Store(): {type(exc).__name__}: {exc}"]
        results: dict[str, Any] = {}
        refused: dict[str, str] = {}
        for name, call, may_refuse in _calls(st):
            try:
                results[name] = call()
            except store.SubagentError as exc:
                refused[name] = exc.code
                if not may_refuse:
                    problems.append(f"{name}: raised {exc.code}: {exc}")
            except Exception as exc:
                problems.append(f"{name}: {type(exc).__name__}: {exc} @ {traceback.format_exc().splitlines()[-3].strip()}")
        problems += _siblings(case, results)
        problems += _format_checks(case, results, refused)
    finally:
        logger.removeHandler(errors)
    problems += [f"logged error: {r.getMessage()}" for r in errors.records]
    if tree_state(st_root) != before:
        changed = [p for p in set(before) | set(tree_state(st_root)) if before.get(p) != tree_state(st_root).get(p)]
        problems.append(f"a read changed the store: {sorted(changed)[:3]}")
    return problems


def _format_checks(case: Damage, results: dict[str, Any], refused: dict[str, str]) -> list[str]:
    """A leftover temporary file is never a session; a torn newest lease slot falls back to the
    acquisition in the other (epoch 1 of owner o3, never no lease); both slots garbage is a
    damaged lease (no lease to readers, corrupt to ``check_lease``); a file cut in its preamble
    or header, or with either overwritten, is a corrupt session, listed as a diagnostic."""
    out = []
    torn = case.how in ("random-bytes", "truncate", "flip")
    if case.kind == "lease" and case.how == "random-bytes" and case.data.strip(b"\0"):
        if results.get("read_lease(c3)") is not None or refused.get("check_lease(c3)") != "CORRUPT_SESSION":
            out.append(f"both lease slots garbage: read_lease {results.get('read_lease(c3)')}, check_lease {refused.get('check_lease(c3)')}")
    if case.kind in ("preamble", "header") and torn:
        row = next((r for r in results.get("list_children(r)") or [] if r.id == "c3"), None)
        if refused.get("inspect(c3)") != "CORRUPT_SESSION" or row is None or row.kind != "diagnostic":
            out.append(f"a damaged {case.kind}: inspect(c3) {refused.get('inspect(c3)', 'read')}, listed as {row}")
    listed = results.get("session_ids") or []
    if any(sid.startswith(".") or "." in sid for sid in listed):
        out.append(f"session_ids: a name that is no session is listed: {listed}")
    if case.kind == "leftover" and listed != ["c1", "c2", "c3", "g1", "r"]:
        out.append(f"session_ids: a creation's leftover changed the sessions listed: {listed}")
    if case.kind == "lease-slot" and case.how in ("random-bytes", "truncate", "flip"):
        lease = results.get("read_lease(c3)")
        if lease is None or (lease.owner, lease.epoch) != ("o3", 1):
            out.append(f"read_lease(c3): a torn newest slot did not fall back to the acquisition: {lease}")
    return out


def _siblings(case: Damage, results: dict[str, Any]) -> list[str]:
    """Damage to c3's files (or its owner) never hides or alters c1 and c2."""
    if case.kind in ("STORE", "parent-index"):
        return []
    rows = results.get("list_children(r)")
    if rows is None:
        return []
    by_id = {r.id: r for r in rows}
    out = []
    for sid, label in (("c1", "one"), ("c2", "two")):
        row = by_id.get(sid)
        if row is None or row.kind != "child" or row.label != label:
            out.append(f"list_children(r): sibling {sid} hidden or changed by damage to c3 ({row})")
    if [r.id for r in rows][:2] != ["c1", "c2"]:
        out.append(f"list_children(r): order changed {[r.id for r in rows]}")
    tree = results.get("list_descendants(r)") or []
    if not {"c1", "c2"} <= {r.entry.id for r in tree}:
        out.append("list_descendants(r): a sibling is missing")
    return out


@functools.lru_cache(maxsize=1)
def _template() -> str:
    """The healthy store, built once per process (creation fsyncs the marker); each case copies it."""
    folder = tempfile.mkdtemp(prefix="dmg-template-")
    atexit.register(shutil.rmtree, folder, True)
    build(folder)
    return folder


def run_case(case: Damage) -> list[str]:
    folder = tempfile.mkdtemp(prefix="dmg-")
    try:
        shutil.copytree(_template(), folder, dirs_exist_ok=True, symlinks=True)
        st = store.Store(os.path.join(folder, "store"), durability="none", create=False)
        outside = os.path.join(folder, "outside")
        open(outside, "wb").write(b"outside the store")
        damage(st, case, outside)
        problems = read_everything(st.root, case)
        if open(outside, "rb").read() != b"outside the store":
            problems.append("a file outside the store was written through a link")
        return problems
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def random_case(rng: random.Random) -> Damage:
    how = rng.choice(HOWS)
    data = bytes(rng.randrange(256) for _ in range(rng.randrange(64))) if how == "random-bytes" else b""
    return Damage(rng.choice(KINDS), how, rng.randrange(2**32), data)


if __name__ == "__main__":  # the counting run of the report: cases tried, cases that found a failure
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 14)
    failed: dict[str, int] = {}
    failures = 0
    calls_failed = 0
    for _ in range(count):
        case = random_case(rng)
        problems = run_case(case)
        if problems:
            failures += 1
            calls_failed += len(problems)
            for p in problems:
                key = p.split(":")[0].split("(")[0]
                failed[key] = failed.get(key, 0) + 1
    print({"cases": count, "failing_cases": failures, "failed_checks": calls_failed, "by_call": failed})
