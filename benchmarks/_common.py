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

__all__ = ["HERE", "REPO", "temp_base", "percentile"]

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
