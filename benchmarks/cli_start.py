"""How long the ``subagents`` command takes to start and answer, against a bare Python started in the same run.

Run ``python benchmarks/cli_start.py [--quick]``. Users run ``subagents ls`` and
``subagents show ID`` in shell loops and scripts, so each start is paid once per
line of a loop: what matters is the whole process, from ``exec`` to exit.

What is measured (wall time of a whole process, median of N rounds; in each round
every command runs once, in turn, so a burst of load on this shared machine falls
on all of them alike):

* ``python`` — ``python -c pass`` with the interpreter of the installed script:
  the baseline (its own start, ``site``, the editable install's path hook);
* ``json`` — ``python -c "import json"``: a second baseline, a stdlib import;
* ``version`` — ``subagents --version``;
* ``help`` — ``subagents --help`` (builds the whole parser, every verb);
* ``ls`` — ``subagents ls`` of a small store (three roots, each with one
  finished ``echo`` child, made by ``subagents run`` before the timing);
* ``show`` — ``subagents show CHILD`` of one of those children.

Each is run through the installed ``subagents`` script (its shebang names the
interpreter the baseline uses), stdout to ``/dev/null``, with no ``SUBAGENTS_*``
variable set, from the store's folder. Every command must exit 0. Without
``PYTHONDONTWRITEBYTECODE`` either: the first (untimed) run of each command
writes the bytecode of every module it loads, as installing the package does;
with it set (as in some shells and CI jobs) every module changed since its
``.pyc`` was written is compiled again at every start, which measures the
compiler, not the start (tens of milliseconds per command here).

Goals, set before the start was cut (ratios to ``python`` in the same run):
``--version`` <= 1.5x (it needs the parser and nothing of the store);
``--help`` <= 2x (argparse builds ~25 verbs' parsers and formats the help);
``ls`` and ``show`` <= 8x each (they read a store: msgpack and the pydantic models
every record is checked against, and the layered configuration, also pydantic).
The last stdout line is one JSON object ``{"benchmark": "cli_start", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import percentile, temp_base  # noqa: E402  (first: puts the repository on sys.path)

NAME = "cli_start"
ROOTS = 3
GOALS = {"version_over_python": 1.5, "help_over_python": 2.0, "ls_over_python": 8.0, "show_over_python": 8.0}
TIMEOUT_S = 120.0


def _script() -> str:
    """The installed ``subagents`` script beside this interpreter (the venv's), else the one on ``PATH``."""
    found = shutil.which("subagents", path=os.path.dirname(sys.executable)) or shutil.which("subagents")
    if found is None:
        raise SystemExit("the subagents script is not installed (pip install -e .)")
    return found


def _interpreter(script: str) -> str:
    """The interpreter the script's shebang names: the baseline must start the same Python."""
    with open(script, encoding="utf-8") as f:
        first = f.readline().strip()
    return first[2:].split()[0] if first.startswith("#!") else sys.executable


def _run(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    """Milliseconds from start to exit of one process; it must succeed."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=TIMEOUT_S)
    elapsed = (time.perf_counter() - t0) * 1e3
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
    return elapsed


def _make_store(script: str, folder: str, env: dict[str, str]) -> str:
    """A small store of ``ROOTS`` roots, each with one finished ``echo`` child; returns a child's id."""
    child = ""
    for i in range(ROOTS):
        done = subprocess.run([script, "--store", "store", "run", "echo", "--prompt", f"hello {i}", "--json"], cwd=folder,
                              env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        if done.returncode != 0:
            raise SystemExit(f"subagents run failed ({done.returncode}): {done.stderr}")
        child = json.loads(done.stdout)["id"]
    return child


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (< 30 s on 2 cores)")
    args = parser.parse_args()
    rounds = 10 if args.quick else 40
    script = _script()
    python = _interpreter(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_") and k != "PYTHONDONTWRITEBYTECODE"}
    folder = tempfile.mkdtemp(prefix=f"{NAME}-", dir=temp_base())
    print(f"{NAME}: temp folder {folder}{' (quick)' if args.quick else ''}; script {script}; interpreter {python}")
    try:
        t0 = time.perf_counter()
        child = _make_store(script, folder, env)
        print(f"store: {ROOTS} roots with one echo child each, made by `subagents run` in {time.perf_counter() - t0:.1f} s")
        commands = {
            "python": [python, "-c", "pass"],
            "json": [python, "-c", "import json"],
            "version": [script, "--version"],
            "help": [script, "--help"],
            "ls": [script, "--store", "store", "ls"],
            "show": [script, "--store", "store", "show", child],
        }
        for argv in commands.values():  # warm the page cache and the bytecode caches
            _run(argv, folder, env)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(rounds):
            for name, argv in commands.items():
                samples[name].append(_run(argv, folder, env))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    ms = {name: statistics.median(values) for name, values in samples.items()}
    base = ms["python"]
    ratios = {f"{name}_over_python": ms[name] / base for name in commands if name != "python"}
    print()
    print(f"wall time of a whole process, median of {rounds} rounds (load average {os.getloadavg()[0]:.2f} at the end):")
    for name, argv in commands.items():
        shown = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv))
        ratio = "" if name == "python" else f"  {ratios[f'{name}_over_python']:5.2f}x python"
        print(f"  {name:8} {ms[name]:7.1f} ms  (p10 {percentile(samples[name], 0.1):6.1f}, p90 {percentile(samples[name], 0.9):6.1f})"
              f"{ratio}   {shown}")
    met = {key: ratios[key] <= goal for key, goal in GOALS.items()}
    print()
    for key, goal in GOALS.items():
        print(f"goal: {key} <= {goal:g}: {ratios[key]:.2f} -> {'met' if met[key] else 'NOT met'}")
    result: dict[str, Any] = {
        "benchmark": NAME,
        "quick": bool(args.quick),
        "rounds": rounds,
        "load": round(os.getloadavg()[0], 2),
        **{f"{name}_ms": round(value, 1) for name, value in ms.items()},
        **{key: round(value, 2) for key, value in ratios.items()},
        "goals": GOALS,
        "goals_met": met,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
