"""A store, or some of its files, that this process may not read or write: named as such, one session at a time.

Found by a probe run as an unprivileged user (earlier probes ran as root, whom no
permission bit stops): another user's store was a bare ``PermissionError``, a
store folder that can be listed but not entered read as "no STORE marker", a
write refused by a file's owner was ``SESSION_UNAVAILABLE`` (which says a file
no longer reads), and one unreadable mailbox ended ``store check`` without a
report. Each test runs the store's call as ``nobody`` (``tests/other_user.py``).
"""

from __future__ import annotations

import os

from subagents import store
from subagents.store.check import check_store

from ..other_user import NOBODY, as_nobody, shared_folder
from ._support import CONTINUABLE, make_child


def _tree(root_folder: str) -> tuple[store.Store, str, str]:
    st = store.Store(os.path.join(root_folder, "store"))
    root = store.new_id()
    store.create_session(st, root)
    child = store.new_id()
    make_child(st, root, child, descriptor=CONTINUABLE)
    store.accept(st, child, source={"kind": "user"}, content="hi", ids=store.IdGenerator())
    return st, root, child


def _open_to_all(st: store.Store) -> None:
    """Every folder of the store readable and enterable by all, every file readable (what a shared store looks like)."""
    for folder, _, files in os.walk(st.root):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


def test_a_store_only_its_owner_may_enter_is_unreadable_not_a_bare_permission_error():
    with shared_folder() as folder:
        st, _, _ = _tree(folder)
        os.chmod(st.root, 0o700)
        for create in (False, True):
            outcome = as_nobody(lambda: store.Store(st.root, create=create))
            assert outcome[0] == "error"
            name, code, message = outcome[1]
            assert (name, code) == ("UnreadableStoreError", "STORE_UNREADABLE"), outcome
            assert st.root in message and "Permission denied" in message


def test_a_store_folder_that_lists_but_cannot_be_entered_is_unreadable_not_another_format():
    """``chmod 744``: its names read, its files do not; it was "not a store: it holds trash and no STORE marker"."""
    with shared_folder() as folder:
        st, _, _ = _tree(folder)
        os.chmod(st.root, 0o744)
        outcome = as_nobody(lambda: store.Store(st.root, create=False))
        assert outcome[0] == "error" and outcome[1][:2] == ("UnreadableStoreError", "STORE_UNREADABLE"), outcome


def test_a_message_to_a_mailbox_another_user_owns_is_a_read_only_store():
    """The folders writable by all, the mailbox root's 0644: the acceptance is refused as a write, not as a file that
    does not read (``SESSION_UNAVAILABLE``), and nothing is written."""
    with shared_folder() as folder:
        st, _, child = _tree(folder)
        _open_to_all(st)
        for sub, _, _ in os.walk(st.root):
            os.chmod(sub, 0o777)
        mailbox = st.path(child, "mailbox")
        before = open(mailbox, "rb").read()
        outcome = as_nobody(lambda: store.accept(store.Store(st.root), child, source={"kind": "user"}, content="x",
                                                 ids=store.IdGenerator()))
        assert outcome[0] == "error" and outcome[1][:2] == ("ReadOnlyStoreError", "STORE_READ_ONLY"), outcome
        assert "cannot be written" in outcome[1][2]
        assert open(mailbox, "rb").read() == before


def test_a_log_another_user_owns_is_a_read_only_store_for_its_writer():
    """Taking a session's lease opens its file to write: refused as a write, naming the file (a probe found the
    CLI saying ``error: STORE_READ_ONLY: its file cannot be written ...``, naming no session)."""
    with shared_folder() as folder:
        st, _, child = _tree(folder)
        _open_to_all(st)
        for sub, _, _ in os.walk(st.root):
            os.chmod(sub, 0o777)

        def take() -> None:
            mine = store.Store(st.root)
            owner = store.new_id()
            store.register_owner(mine, owner, ttl=30.0)
            store.acquire_lease(mine, child, owner)

        outcome = as_nobody(take)
        assert outcome[0] == "error" and outcome[1][:2] == ("ReadOnlyStoreError", "STORE_READ_ONLY"), outcome
        assert outcome[1][2].startswith(f"sessions/{child} cannot be written by this process"), outcome


def test_an_unreadable_mailbox_is_one_violation_of_its_session_not_the_end_of_the_check():
    with shared_folder() as folder:
        st, root, child = _tree(folder)
        _open_to_all(st)
        os.chmod(st.path(child, "mailbox"), 0o600)
        outcome = as_nobody(lambda: check_store(st.root).to_dict())
        assert outcome[0] == "ok", outcome
        report = outcome[1]
        assert [(v["session_id"], v["kind"]) for v in report["violations"]] == [(child, "unreadable")], report
        assert report["counts"]["sessions"] == 2


def test_gc_keeps_a_subtree_it_may_not_write_and_collects_the_others():
    """A store its user owns, where one child's file is root's (a ``sudo subagents run`` left it): gc stopped at
    that file with ``PermissionError`` (after deleting the subtrees before it, and reporting none of them); it
    keeps that subtree, saying why, and collects the rest."""
    from .test_retention import DAY, subtree

    with shared_folder() as folder:
        st = store.Store(os.path.join(folder, "store"))
        ids = {root: subtree(st, root) for root in ("rA", "rB", "rC")}
        for sub, _, files in os.walk(st.root):
            os.chown(sub, NOBODY, NOBODY)
            for name in files:
                os.chown(os.path.join(sub, name), NOBODY, NOBODY)
        os.chown(st.session_path("rBc1"), 0, 0)
        os.chmod(st.session_path("rBc1"), 0o644)  # it reads (listings show it), it does not lock or move
        os.chown(st.children_index_path("rCc0"), 0, 0)  # an index gc would have to write: it refused the whole gc
        os.chmod(st.children_index_path("rCc0"), 0o644)

        def gc() -> tuple[list[str], list[tuple[str, str, str]]]:
            report = store.collect(store.Store(st.root), 7 * DAY)
            return [c.id for c in report.collected], [(s.id, s.session, s.reason) for s in report.skipped]

        outcome = as_nobody(gc)
        assert outcome == ("ok", (["rA"], [("rB", "rBc1", "unwritable"), ("rC", "rCc0", "unwritable")])), outcome
        assert all(st.exists(sid) for sid in ids["rB"] + ids["rC"]) and not any(st.exists(sid) for sid in ids["rA"])


def test_a_roots_index_that_does_not_read_is_said_once_and_read_around():
    """An unreadable ``index/roots`` was read around in silence (a garbled one is warned about): the listing
    is whole from the headers, and a warning names the file and the fix, as for damage."""
    import logging

    from subagents.store.roots import list_roots, roots_index_path

    with shared_folder() as folder:
        st, root, _ = _tree(folder)
        _open_to_all(st)
        os.chmod(roots_index_path(st), 0o600)

        def listing() -> tuple[list[str], list[str]]:
            said: list[str] = []
            handler = logging.Handler()
            handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
            logging.getLogger("subagents").addHandler(handler)
            rows = list_roots(store.Store(st.root, create=False))
            return [r.id for r in rows], said

        outcome = as_nobody(listing)
        assert outcome[0] == "ok", outcome
        ids, said = outcome[1]
        assert ids == [root]
        assert len(said) == 1 and "index/roots cannot be read" in said[0] and "store reindex" in said[0], said


def test_reindex_refuses_before_it_rewrites_anything_when_an_index_is_not_its_to_write():
    """One root's children index is root's (a ``sudo`` run left it): reindex rewrote the indexes sorted before it,
    then failed on it. It refuses first (``STORE_READ_ONLY``), every index as it was."""
    with shared_folder() as folder:
        st = store.Store(os.path.join(folder, "store"))
        roots = sorted(store.new_id() for _ in range(3))
        for root in roots:
            store.create_session(st, root)
            make_child(st, root, store.new_id(), descriptor=CONTINUABLE)
        for sub, _, files in os.walk(st.root):
            os.chown(sub, NOBODY, NOBODY)
            for name in files:
                os.chown(os.path.join(sub, name), NOBODY, NOBODY)
        theirs = st.children_index_path(roots[-1])
        os.chown(theirs, 0, 0)
        os.chmod(theirs, 0o644)
        before = {root: open(st.children_index_path(root), "rb").read() for root in roots}
        outcome = as_nobody(lambda: store.reindex(store.Store(st.root, create=False)))
        assert outcome[0] == "error" and outcome[1][:2] == ("ReadOnlyStoreError", "STORE_READ_ONLY"), outcome
        assert {root: open(st.children_index_path(root), "rb").read() for root in roots} == before


def test_a_sessions_folder_that_cannot_be_listed_makes_the_store_unreadable_for_every_reader():
    """``sessions/`` at 0711 (entered, not listed): ``ls`` said STORE_READ_ONLY (a read-only label for a read),
    ``store check`` raised a bare PermissionError, and ``fsck`` checked 0 sessions and advised reindexing every
    index entry away as stale. Each is STORE_UNREADABLE, naming the folder."""
    from subagents.store.fsck import fsck
    from subagents.store.prefix import short_ids

    with shared_folder() as folder:
        st, root, child = _tree(folder)
        _open_to_all(st)
        os.chmod(st.sessions_dir, 0o711)
        calls = {
            "session_ids": lambda: store.Store(st.root, create=False).session_ids(),
            "short_ids": lambda: short_ids(store.Store(st.root, create=False), [root, child]),
            "check": lambda: check_store(st.root),
            "fsck": lambda: fsck(store.Store(st.root, create=False), repair=False, lease_ttl_s=5.0),
        }
        for name, call in calls.items():
            outcome = as_nobody(call)
            assert outcome[0] == "error" and outcome[1][:2] == ("UnreadableStoreError", "STORE_UNREADABLE"), (name, outcome)
            assert st.sessions_dir in outcome[1][2], (name, outcome)


def test_fsck_counts_a_session_it_may_not_read_as_unreadable_not_corrupt():
    """A child's file root's and 0600 (a ``sudo`` run): fsck counted it ``corrupt`` and the CLI said its committed
    work would be lost if repaired. Nothing of it is known to be damaged: it is counted ``unreadable``."""
    from subagents.store.fsck import fsck
    from subagents.supervisor.cli import render

    with shared_folder() as folder:
        st, root, child = _tree(folder)
        _open_to_all(st)
        os.chmod(st.session_path(child), 0o600)
        outcome = as_nobody(lambda: fsck(store.Store(st.root, create=False), repair=False, lease_ttl_s=5.0))
        assert outcome[0] == "ok", outcome
        report = outcome[1]
        assert report["counts"] == {"clean": 1, "torn": 0, "corrupt": 0, "unsupported": 0, "unreadable": 1}, report
        assert [(f["id"], f["kind"]) for f in report["findings"]] == [(child, "unreadable"), (child, "index-unproven")]
        import io

        text = io.StringIO()
        render.render_fsck(render.Output(text), report)
        assert "1 unreadable" in text.getvalue() and "committed work would be lost" not in text.getvalue()


def test_preparing_an_index_another_user_owns_is_left_to_the_first_append():
    """``prepare_index`` is best effort (made with every root): a file in the way it may not write is left for
    the first append to report, as one in the way of any other kind, not raised at the root's creation."""
    from subagents.store.index import prepare_index

    with shared_folder() as folder:
        st, root, _ = _tree(folder)
        _open_to_all(st)
        for sub, _, _ in os.walk(st.root):
            os.chmod(sub, 0o777)
        outcome = as_nobody(lambda: prepare_index(store.Store(st.root, create=False), root))
        assert outcome == ("ok", None), outcome
