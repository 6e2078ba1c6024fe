"""What every benchmark shares: the repository importable, a temp folder on its file system, percentiles.

Imported as ``_common`` by scripts run as ``python benchmarks/NAME.py`` (their
folder is first on ``sys.path``). The project itself imports as
``subagents`` once installed (``pip install -e .``); importing this module
also puts the repository on ``sys.path`` and on ``PYTHONPATH`` (worker
processes inherit the latter), so programs referenced by import path from
the checkout load in workers.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time

__all__ = ["HERE", "REPO", "temp_base", "percentile", "new_file_us"]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)


def temp_base() -> str:
    """A temp parent on the repository's file system (``/tmp`` when it shares the device, else ``benchmarks/``).

    Each benchmark makes its own ``mkdtemp`` folder under it and removes it at the end.
    """
    tmp = tempfile.gettempdir()
    if os.stat(tmp).st_dev == os.stat(REPO).st_dev:
        return tmp
    return HERE


def percentile(samples: list[int] | list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1); NaN for no samples."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return float(ordered[max(1, math.ceil(q * len(ordered))) - 1])


# A new file's cost on a quiet ext4 of this machine is ~10-40 us; after many deletions in the last
# minutes, an ext4 without a journal scans past every recently freed inode for each new one (its
# ``recently_deleted`` check), and the same file costs several times that. One child makes one file.
NEW_FILES = 200


def new_file_us(parent: str) -> float:
    """Mean microseconds to create one empty file, in a new folder under ``parent`` that is left in place.

    A probe of the file system's state: benchmarks that create a file per item print it beside their
    throughput, so a figure measured while the disk was slow to allocate inodes reads as that, not
    as the code's. The files stay (the caller removes ``parent``): deleting them here would leave
    freed inodes for the measured run to scan past.
    """
    folder = tempfile.mkdtemp(prefix="probe-", dir=parent)
    t0 = time.perf_counter()
    for i in range(NEW_FILES):
        os.close(os.open(os.path.join(folder, str(i)), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    return (time.perf_counter() - t0) / NEW_FILES * 1e6
