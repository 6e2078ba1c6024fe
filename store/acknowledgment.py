"""Whether a child its parent's index does not list was ever given to anyone.

A child is created in two steps (``store/session.py``): its session file is
written, made durable and named, then its entry is appended to its parent's
children index; the creation returns — hands the id out — only after the
append. A creator killed between the two leaves a header that proves a child
nobody was told of: it never ran, no listing shows it, and ``reindex`` must
not make it appear. Yet an index entry can also be lost (a damaged or
removed index file), and then the header is all that still lists a child a
user was given. The two look alike from the header; what tells them apart is
use. Creation writes the session file alone: the header, the creator's lease
(epoch 1, ``running``) or none, and a log of events at epoch 0 (the seed,
the descriptor and policy events, a one-shot child's prompt). Anything
beyond that — a record its creation did not write, a lease taken again or
released, a mailbox, a control file, an identity cache, children of its
own — was written by someone who had its id, so the child was acknowledged.

``evidence_of_use`` is that test, shared by ``reindex`` (which leaves an
unused, unlisted child out of the index it rebuilds, unless asked to keep
it), ``check`` (which counts such a child instead of reporting it) and
``fsck`` (which reports it as ``unacknowledged``). A child the index lists
needs no test: it was acknowledged.
"""

from __future__ import annotations

import os

from .errors import SessionNotFoundError, SubagentError
from .reader import inspect_file, open_session
from .root import COMPANIONS, Store

__all__ = ["evidence_of_use"]


def evidence_of_use(store: Store, session_id: str, *, has_children: bool = False) -> str | None:
    """What shows that ``session_id`` was used after its creation, or ``None`` when nothing does.

    ``has_children``: the caller knows of a header naming it as parent (a delegation runs in a
    turn of its own). Anything that cannot be read counts as use: only a session whose files
    read as exactly what a creation writes is unproven, so damage never hides a child.
    """
    if has_children:
        return "it has children of its own"
    for name in COMPANIONS:
        if os.path.lexists(store.path(session_id, name)):
            return f"its {name} file exists"
    try:
        own_index = os.lstat(store.children_index_path(session_id)).st_size
    except FileNotFoundError:
        own_index = 0
    except OSError as exc:
        return f"its children index cannot be read ({exc.strerror or exc})"
    if own_index:
        return "its children index has entries"
    try:
        with open_session(store, session_id) as file:
            found = inspect_file(file)
            slots = file.read_slots()
    except SessionNotFoundError:
        return None  # removed meanwhile: nothing left to list
    except SubagentError as exc:
        return f"its file does not read as a creation left it ({exc.code})"
    except OSError as exc:
        return f"its file cannot be read ({exc.strerror or exc})"
    if slots.problem is not None:
        return f"its lease slots do not read ({slots.problem})"
    lease = slots.lease
    if found.status != "clean":
        return f"its log was appended to after its creation ({found.status} tail)"
    for event in found.events[found.header.seed_length or 0 :]:
        epoch = event.get("epoch")
        if event.get("type") == "turn/start":
            return f"a turn started (seq {event['seq']})"
        if epoch != 0:
            return f"an event was written at epoch {epoch} (seq {event['seq']})"
    if lease is not None and (lease.epoch > 1 or lease.state != "running"):
        return f"its lease was taken or released after its creation (epoch {lease.epoch}, {lease.state})"
    return None
