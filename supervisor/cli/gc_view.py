"""What ``subagents gc`` prints: one line per subtree deleted (or that would be) or kept, then the totals.

``gc_doc`` turns a ``store.GcReport`` into the plain data ``--json`` prints
(ISO 8601 times, whole ids: a deleted id has no prefix to resolve any more);
``render_gc`` prints its text form. Called by ``maintenance.cmd_gc`` only.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import TYPE_CHECKING, Any

from .columns import aligned, iso, relative
from .render import Output

if TYPE_CHECKING:
    from subagents.store.retention import GcReport

__all__ = ["gc_doc", "render_gc"]


def gc_doc(report: GcReport) -> dict[str, Any]:
    return {
        "store": report.store,
        "dry_run": report.dry_run,
        "older_than_s": report.older_than_s,
        "cutoff": iso(report.cutoff),
        "outcomes": list(report.outcomes),
        "collected": [{**dataclasses.asdict(c), "last_active": iso(c.last_active)} for c in report.collected],
        "skipped": [dataclasses.asdict(s) for s in report.skipped],
        "young": report.young,
        "other_outcome": report.other_outcome,
        "finished": report.finished,
        "set_aside": report.set_aside,
        "owners_removed": report.owners_removed,
        "leftovers_removed": report.leftovers_removed,
        "reserve_spent": report.reserve_spent,
        "reserve_kept": report.reserve_kept,
        "sessions": report.sessions,
        "bytes": report.bytes,
        "elapsed_s": round(report.elapsed_s, 3),
    }


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def render_gc(out: Output, doc: dict[str, Any]) -> None:
    now = time.time()
    verb = "would delete" if doc["dry_run"] else "deleted"
    rows = [[verb, c["id"], _plural(c["sessions"], "session"), _size(c["bytes"]),
             relative(_epoch(c["last_active"]), now), c["outcome"] or "-", c["label"] or ""] for c in doc["collected"]]
    rows += [["kept", s["id"], s["reason"], "", "", "", s["detail"]] for s in doc["skipped"]]
    if rows:
        for line in aligned(("", "ROOT", "SESSIONS", "SIZE", "ACTIVE", "OUTCOME", "LABEL / WHY KEPT"), rows):
            out.line(line)
    if doc["finished"] and doc["dry_run"]:
        out.line(f"an interrupted gc left {_plural(doc['finished'], 'folder')} in trash/: gc empties them first")
    elif doc["finished"]:
        out.line(f"finished an interrupted gc: {_plural(doc['finished'], 'folder')} emptied from trash/")
    if doc["set_aside"]:
        out.line(f"warning: {_plural(doc['set_aside'], 'folder')} of another program left in trash/.foreign.*, never "
                 "deleted by gc: see `subagents store fsck`")
    if doc["owners_removed"]:
        owners = _plural(doc["owners_removed"], "record")
        out.line(f"{'would remove' if doc['dry_run'] else 'removed'} {owners} of crashed supervisors that held nothing (owners/)")
    if doc["leftovers_removed"]:
        files = _plural(doc["leftovers_removed"], "temporary file")
        out.line(f"{'would remove' if doc['dry_run'] else 'removed'} {files} of writes a kill interrupted")
    if doc["reserve_spent"]:
        again = "made again: the disk has room" if doc["reserve_kept"] else "made again by the next start or gc with room to spare"
        out.line(f"the disk had no room left: gc spent the store's reserve (trash/.reserve) to begin; {again}")
    total = (f"{verb} {_plural(len(doc['collected']), 'subtree')}, {_plural(doc['sessions'], 'session')}, "
             f"{_size(doc['bytes'])} in {doc['elapsed_s']:.2f} s")
    kept = [f"{doc['young']} active within {_age(doc['older_than_s'])}"]
    if doc["outcomes"]:
        kept.append(f"{doc['other_outcome']} of another outcome than {','.join(doc['outcomes'])}")
    if doc["skipped"]:
        kept.append(f"{len(doc['skipped'])} held back (above)")
    out.line(f"{total}; kept {', '.join(kept)}" + ("; nothing was changed (--dry-run)" if doc["dry_run"] else ""))


def _epoch(text: str | None) -> float | None:
    if text is None:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
