"""Stores of format version 1, written byte for byte as a build of that version left them.

Version 1 keeps a session in a folder ``sessions/<id>/``: ``header`` (one msgpack map),
``log`` (framed events), ``identity`` (one framed record ``{seq: 0, projection}``),
``lease`` (a msgpack map; absent before the first lease), ``mailbox`` and ``control``
(framed records), ``.lock`` (empty, never deleted). A folder without ``header`` is a
creation that crashed; a ``gc`` moves a whole folder to ``trash/<id>.<hex>/``. The
index files did not change between the versions.

``V1Store`` writes such stores from scratch; ``demote`` rewrites a store the current
build wrote (a supervisor's real sessions) into that layout. ``snapshot`` is a
store's names and bytes, to compare two migrations.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack

from subagents.store.framing import encode_record
from subagents.store.migrate import migrate
from subagents.store.projection import Projection
from subagents.store.root import COMPANIONS
from subagents.store.session_file import SessionFile

__all__ = ["V1Store", "demote", "snapshot", "v1_event", "v3_store"]


def v1_event(seq: int, kind: str, data: Any = None, *, ts: float = 1000.0, epoch: int = 0) -> dict[str, Any]:
    return {"seq": seq, "ts": ts, "type": kind, "data": {} if data is None else data, "epoch": epoch}


def _framed(records: list[dict[str, Any]]) -> bytes:
    return b"".join(encode_record(r) for r in records)


def _touch(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def identity_cache(events: list[dict[str, Any]], seed_length: int = 0) -> bytes:
    """The ``identity`` file of a log of ``events``: the projection of all of them."""
    projection = Projection(seed_length=seed_length)
    offset = 0
    for event in events:
        end = offset + len(encode_record(event))
        projection.apply(event, offset, end)
        offset = end
    return encode_record({"seq": 0, "projection": projection.to_record()})


class V1Store:
    """A version-1 store folder, written file by file."""

    def __init__(self, root: str | os.PathLike[str], *, max_record_bytes: int | None = 16 * 1024 * 1024) -> None:
        self.root = os.fspath(root)
        for sub in ("", "sessions", "owners", "index", os.path.join("index", "children")):
            os.makedirs(os.path.join(self.root, sub), mode=0o700, exist_ok=True)
        marker: dict[str, Any] = {"format": "subagents-store", "version": 1}
        if max_record_bytes is not None:
            marker["max_record_bytes"] = max_record_bytes
        _write(os.path.join(self.root, "STORE"), msgpack.packb(marker))
        self.roots_seq = 0
        self.children_seq: dict[str, int] = {}

    def folder(self, session_id: str) -> str:
        return os.path.join(self.root, "sessions", session_id)

    def session(
        self, session_id: str, events: list[dict[str, Any]], *, parent: str | None = None, origin: str | None = None,
        depth: int = 0, created_at: float = 1000.0, label: str | None = None, lease: dict[str, Any] | None = None,
        mailbox: list[dict[str, Any]] = (), control: list[dict[str, Any]] = (), identity: bool = True, tail: bytes = b"",
        folder: str | None = None,
    ) -> None:
        """A published session: its folder with every file version 1 wrote (``tail``: bytes after the log's records)."""
        header: dict[str, Any] = {"version": 1, "id": session_id, "created_at": created_at}
        if parent is not None:
            header["parent_session"] = parent
        if origin is not None:
            header["origin"] = origin
        header["delegation_depth"] = depth
        if label is not None:
            header["label"] = label
        where = folder or self.folder(session_id)
        os.mkdir(where, 0o700)
        _write(os.path.join(where, "log"), _framed(events) + tail)
        if identity:
            _write(os.path.join(where, "identity"), identity_cache(events))
        if lease is not None:
            _write(os.path.join(where, "lease"), msgpack.packb(lease))
        if mailbox:
            _write(os.path.join(where, "mailbox"), _framed([{"seq": i, **m} for i, m in enumerate(mailbox)]))
        if control:
            _write(os.path.join(where, "control"), _framed([{"seq": i, **c} for i, c in enumerate(control)]))
        _write(os.path.join(where, ".lock"), b"")
        _write(os.path.join(where, "header"), msgpack.packb(header))

    def debris(self, session_id: str, events: list[dict[str, Any]]) -> None:
        """A creation that crashed before its header: a folder with a log and no header."""
        os.mkdir(self.folder(session_id), 0o700)
        _write(os.path.join(self.folder(session_id), "log"), _framed(events))

    def trashed(self, session_id: str, events: list[dict[str, Any]], **kwargs: Any) -> str:
        """A session a ``gc`` of version 1 moved to the trash and did not finish (its folder there)."""
        os.makedirs(os.path.join(self.root, "trash"), mode=0o700, exist_ok=True)
        where = os.path.join(self.root, "trash", f"{session_id}.0badcafe")
        self.session(session_id, events, folder=where, **kwargs)
        return where

    def root_entry(self, session_id: str, created_at: float = 1000.0) -> None:
        _touch(os.path.join(self.root, "index", "roots.lock"))  # versions 1 to 3 locked a file beside each index
        with open(os.path.join(self.root, "index", "roots"), "ab") as out:
            out.write(encode_record({"id": session_id, "created_at": created_at, "seq": self.roots_seq}))
        self.roots_seq += 1

    def child_entry(self, parent: str, child: str, *, mode: str, label: str | None, created_at: float = 1000.0) -> None:
        seq = self.children_seq.get(parent, 0)
        record: dict[str, Any] = {"seq": seq, "id": child, "created_at": created_at, "origin": "subagent", "mode": mode}
        if label is not None:
            record["label"] = label
        _touch(os.path.join(self.root, "index", "children", f"{parent}.lock"))
        with open(os.path.join(self.root, "index", "children", parent), "ab") as out:
            out.write(encode_record(record))
        self.children_seq[parent] = seq + 1

    def owner(self, owner_id: str, record: dict[str, Any]) -> None:
        self.owner_file(self.root, owner_id, record)

    @staticmethod
    def owner_file(root: str | os.PathLike[str], owner_id: str, record: dict[str, Any]) -> None:
        """``owners/<id>``: a supervisor's record (the same in both versions)."""
        _write(os.path.join(os.fspath(root), "owners", owner_id), msgpack.packb(record))


def demote(root: str | os.PathLike[str]) -> None:
    """Rewrite a store of the current version as version 1: each session file becomes a folder."""
    root = os.fspath(root)
    sessions = os.path.join(root, "sessions")
    for name in sorted(os.listdir(sessions)):
        path = os.path.join(sessions, name)
        if "." in name or not os.path.isfile(path):
            continue
        with SessionFile.open(name, path) as file:
            header, log, lease = file.header_map, file.read_log(), file.read_slots().lease
        os.unlink(path)
        os.mkdir(path, 0o700)
        _write(os.path.join(path, "header"), msgpack.packb(header))
        _write(os.path.join(path, "log"), log)
        _write(os.path.join(path, ".lock"), b"")
        if lease is not None:
            _write(os.path.join(path, "lease"), msgpack.packb(lease.to_record()))
        for companion in COMPANIONS:
            if os.path.exists(f"{path}.{companion}"):
                os.rename(f"{path}.{companion}", os.path.join(path, companion))
    marker = os.path.join(root, "STORE")
    info = msgpack.unpackb(Path(marker).read_bytes())
    os.unlink(marker)
    _write(marker, msgpack.packb({**info, "version": 1}))


def snapshot(root: str | os.PathLike[str]) -> dict[str, bytes | None]:
    """Every path under ``root`` (relative) with its bytes (``None`` for a folder)."""
    root = os.fspath(root)
    found: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(root):
        found[os.path.relpath(folder, root)] = None
        for name in files:
            found[os.path.relpath(os.path.join(folder, name), root)] = Path(folder, name).read_bytes()
    return found


# -- one store with every case a migration meets ------------------------------------------

ONE_SHOT = {"version": 1, "mode": "one-shot", "provider": "spawn", "label": "worker"}
CONTINUABLE = {"version": 1, "mode": "continuable", "provider": "spawn", "label": "helper"}
DEAD = {"owner": "deadOwner", "host": "elsewhere/0", "pid": 1, "pid_start": 1, "started_at": 900.0, "heartbeat_at": 900.0, "ttl": 10.0}


def _message(message_id: str) -> dict[str, Any]:
    return {"id": message_id, "ts": 1001.0, "source": {"kind": "parent"}, "content": f"do {message_id}", "wake": True}


def build_sample(root: str | os.PathLike[str]) -> dict[str, Any]:
    """A version-1 store: two roots (one with three children), a torn log tail, a continuable
    child with pending mail and a control request, leases of a dead owner (released, idle, one
    running mid-turn), a crashed creation and an unfinished ``gc``. Returns what it wrote."""
    v1 = V1Store(root)
    v1.owner("deadOwner", DEAD)
    events: dict[str, list[dict[str, Any]]] = {
        "r1": [v1_event(0, "turn/start", epoch=1), v1_event(1, "turn/end", {"stop_reason": "completed"}, epoch=1)],
        "r2": [],
        "c1": [v1_event(0, "subagent/descriptor", ONE_SHOT), v1_event(1, "turn/start", epoch=1),
               v1_event(2, "turn/end", {"stop_reason": "completed"}, epoch=1)],
        "c2": [v1_event(0, "subagent/descriptor", CONTINUABLE), v1_event(1, "message/accepted", {"message_id": "m1"}, epoch=2),
               v1_event(2, "turn/start", {"message_id": "m1"}, epoch=2), v1_event(3, "turn/end", {"stop_reason": "completed"}, epoch=2)],
        "c3": [v1_event(0, "subagent/descriptor", ONE_SHOT), v1_event(1, "turn/start", epoch=3),
               v1_event(2, "tool/call", {"call_id": "k1"}, epoch=3)],
    }
    v1.session("r1", events["r1"], label="first", lease={"owner": "deadOwner", "epoch": 1, "state": "released", "acquired_at": 1000.5})
    v1.session("r2", events["r2"], label="second", created_at=1002.0, identity=False)
    torn = encode_record(v1_event(3, "assistant/message", {"text": "cut"}, epoch=1))[:11]
    v1.session("c1", events["c1"], parent="r1", origin="subagent", depth=1, tail=torn,
               lease={"owner": "deadOwner", "epoch": 1, "state": "released", "acquired_at": 1000.5})
    v1.session("c2", events["c2"], parent="r1", origin="subagent", depth=1, created_at=1000.1,
               lease={"owner": "deadOwner", "epoch": 2, "state": "idle", "acquired_at": 1001.5},
               mailbox=[_message("m1"), _message("m2"), _message("m3")],
               control=[{"id": "q1", "ts": 1003.0, "kind": "interrupt", "data": {"reason": "user"}}])
    v1.session("c3", events["c3"], parent="r1", origin="subagent", depth=1, created_at=1000.2,
               lease={"owner": "deadOwner", "epoch": 3, "state": "running", "acquired_at": 1002.5})
    v1.debris("d1", [v1_event(0, "subagent/descriptor", ONE_SHOT)])
    v1.trashed("t1", [v1_event(0, "turn/start", epoch=1)], label="gone", created_at=999.0)
    v1.root_entry("t1", 999.0)
    v1.root_entry("r1", 1000.0)
    v1.root_entry("r2", 1002.0)
    v1.child_entry("r1", "c1", mode="one-shot", label="worker", created_at=1000.0)
    v1.child_entry("r1", "c2", mode="continuable", label="helper", created_at=1000.1)
    v1.child_entry("r1", "c3", mode="one-shot", label="worker", created_at=1000.2)
    return {"events": events, "torn": torn, "epochs": {"r1": 1, "c1": 1, "c2": 2, "c3": 3}}


def v3_store(root: str | os.PathLike[str]) -> list[str]:
    """A store as a build of version 3 left it: ``build_sample`` converted, an empty lock file beside each
    index (version 3 locked those, not the indexes), its marker at version 3. The lock files' paths."""
    build_sample(root)
    migrate(root)
    locks = [os.path.join(root, "index", "roots.lock"), os.path.join(root, "index", "children", "r1.lock")]
    for path in locks:
        open(path, "ab").close()
    marker = os.path.join(root, "STORE")
    with open(marker, "rb") as handle:
        info = msgpack.unpackb(handle.read())
    with open(marker, "wb") as handle:
        handle.write(msgpack.packb({**info, "version": 3}))
    return locks
