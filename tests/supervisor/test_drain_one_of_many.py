"""``drain_children`` of one settled child reads that child's files, never its siblings'.

A soak probe (a host that ran thousands of operations under one root) found the cost of draining one
settled continuable child growing with every child the root ever had: which of the named children
were continuable was learned from a listing of all the parent's children, which ``lstat``s or reads
each one's session file (~30 ms of CPU a drain with 800 siblings). The files a drain touches are
recorded here through ``os``'s own calls, in the supervisor's process (the drain runs there).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest

from subagents.store import read_lease

from .test_continuable import S, continuable_supervisor, settled_all, start

pytestmark = pytest.mark.anyio


def recording(monkeypatch: pytest.MonkeyPatch, seen: list[str]) -> None:
    """Record the path of every ``os.open`` / ``os.stat`` / ``os.lstat`` made from now on."""
    for name in ("open", "stat", "lstat"):
        original: Callable[..., Any] = getattr(os, name)

        def wrapped(path: Any, *args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            seen.append(os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path))
            return _original(path, *args, **kwargs)

        monkeypatch.setattr(os, name, wrapped)


async def test_draining_one_settled_child_reads_none_of_its_siblings(tmp_path, monkeypatch):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        children = [(await start(sup, root, S({"return": f"child {i}"})))[0] for i in range(6)]
        await settled_all(sup, root, children)
        target, siblings = children[0], children[1:]

        seen: list[str] = []
        recording(monkeypatch, seen)
        await sup.drain_children(root, [target])
        monkeypatch.undo()

        assert any(target in path for path in seen)  # the drain did read the child it drained
        touched = sorted({sib for sib in siblings for path in seen if sib in path})
        assert touched == [], f"draining {target} touched the files of siblings {touched}"
        assert read_lease(sup.store, target).state == "released"
