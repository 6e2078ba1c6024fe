"""``Chaos``: signals the processes of a test at random, seeded times, and says what it did.

A background thread sleeps a random interval, picks a target group (``worker``,
``supervisor``, ... : each a callable returning the pids it may hit right now), a
pid of it and an action — ``kill`` (SIGKILL) or ``stop`` (SIGSTOP, then SIGCONT
after a random pause) — all drawn from one ``random.Random(seed)``. Every action
is logged (logger ``subagents.testing.chaos``) and kept in ``actions`` with the
seed, so a failing run can be replayed with the same seed. Leaving the context
continues every process it stopped. Used by the ``subagents_chaos`` fixture;
usable on its own in any test.

Not guaranteed: a replay repeats the same draws, not the same interleaving (which
pid is hit depends on which processes are alive at that moment); and a pid that
exits between being listed and being signalled may be reused by the system in
that window (microseconds). The calling process itself is never signalled.
"""

from __future__ import annotations

import heapq
import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Callable, Iterable, Literal, Mapping

__all__ = ["ChaosAction", "Chaos", "workers_of", "processes"]

log = logging.getLogger(__name__)

ActionName = Literal["kill", "stop", "cont"]
PidSource = Callable[[], Iterable[int]]


@dataclass(frozen=True)
class ChaosAction:
    """One signal sent: when (seconds after the chaos began), what, to which group and pid, under which seed."""

    seed: int
    index: int
    at_s: float
    action: ActionName
    target: str
    pid: int

    def __str__(self) -> str:
        return f"chaos seed={self.seed} #{self.index} +{self.at_s:.3f}s {self.action} {self.target} pid {self.pid}"


def workers_of(supervisor: object) -> PidSource:
    """The worker processes of an in-process ``Supervisor`` (its pool's live workers)."""
    pool = getattr(supervisor, "pool")
    return lambda: [worker.pid for worker in pool.workers()]


def processes(*procs: object) -> PidSource:
    """The still-running ones of some ``subprocess.Popen`` (or ``multiprocessing.Process``) objects."""

    def alive() -> list[int]:
        found = []
        for proc in procs:
            poll = getattr(proc, "poll", None)
            running = poll() is None if poll is not None else getattr(proc, "is_alive")()
            if running:
                found.append(int(getattr(proc, "pid")))
        return found

    return alive


class Chaos:
    """``with Chaos({"worker": workers_of(sup)}, seed=7): ...`` — signals those pids until the block ends.

    ``interval_s``: the pause before each action is drawn uniformly from this range.
    ``actions``: what may be done (``"kill"``, ``"stop"``). ``stop_for_s``: how long a
    stopped process stays stopped (keep it under the lease TTL unless the test means
    to let its leases expire). ``max_actions``: stop acting after this many.
    """

    def __init__(
        self,
        targets: Mapping[str, PidSource] | PidSource,
        *,
        seed: int | None = None,
        interval_s: tuple[float, float] = (0.05, 0.3),
        actions: Iterable[Literal["kill", "stop"]] = ("kill", "stop"),
        stop_for_s: tuple[float, float] = (0.05, 0.5),
        max_actions: int | None = None,
    ) -> None:
        self.targets = dict(targets) if isinstance(targets, Mapping) else {"process": targets}
        self.seed = random.SystemRandom().randrange(1 << 32) if seed is None else seed
        self.interval_s = interval_s
        self.choices: tuple[Literal["kill", "stop"], ...] = tuple(actions)
        self.stop_for_s = stop_for_s
        self.max_actions = max_actions
        self.actions: list[ChaosAction] = []
        self._rng = random.Random(self.seed)
        self._done = threading.Event()
        self._stopped: list[tuple[float, int, str]] = []  # (when to continue, pid, target): a heap
        # pids killed already: a dying process may still be listed (and unreaped) for a while;
        # leaving it out keeps a replay's picks the same and never kills a process twice
        self._killed: set[int] = set()
        self._thread: threading.Thread | None = None
        self._began = 0.0
        self._error: BaseException | None = None
        if not self.targets or not self.choices or not set(self.choices) <= {"kill", "stop"}:
            raise ValueError("Chaos needs at least one target and actions among 'kill' and 'stop'")

    def __enter__(self) -> "Chaos":
        log.warning("chaos seed=%d starts on %s (replay with this seed)", self.seed, ", ".join(sorted(self.targets)))
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"subagents-chaos-{self.seed}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        while self._stopped:
            _, pid, target = heapq.heappop(self._stopped)
            self._signal("cont", target, pid)
        log.warning("chaos seed=%d ends after %d action(s)", self.seed, len(self.actions))
        if self._error is not None and kind is None:
            raise RuntimeError(f"chaos seed={self.seed} failed") from self._error

    def summary(self) -> str:
        """The seed and every action, one per line (what a failure report shows)."""
        return "\n".join([f"chaos seed={self.seed}: {len(self.actions)} action(s)", *map(str, self.actions)])

    # -- the thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            next_at = self._began + self._rng.uniform(*self.interval_s)
            while not self._done.is_set():
                wake = min([next_at] + [when for when, _, _ in self._stopped[:1]])
                if self._done.wait(max(0.0, wake - time.monotonic())):
                    return
                now = time.monotonic()
                while self._stopped and self._stopped[0][0] <= now:
                    _, pid, target = heapq.heappop(self._stopped)
                    self._signal("cont", target, pid)
                if now >= next_at:
                    if self.max_actions is None or self._acts() < self.max_actions:
                        self._act()
                    next_at = now + self._rng.uniform(*self.interval_s)
        except BaseException as exc:  # reported by __exit__: the test must not pass on a broken chaos
            self._error = exc

    def _acts(self) -> int:
        return sum(1 for a in self.actions if a.action != "cont")

    def _act(self) -> None:
        # every draw happens whether or not a pid is found, so a replay draws the same sequence
        target = self._rng.choice(sorted(self.targets))
        action = self._rng.choice(self.choices)
        pause = self._rng.uniform(*self.stop_for_s)
        pick = self._rng.random()
        spared = {pid for _, pid, _ in self._stopped} | self._killed | {os.getpid()}
        pids = sorted(p for p in set(self.targets[target]()) if p > 1 and p not in spared)
        if not pids:
            log.info("chaos seed=%d: no %s process to %s", self.seed, target, action)
            return
        pid = pids[int(pick * len(pids))]
        if action == "kill":
            self._killed.add(pid)
        if self._signal(action, target, pid) and action == "stop":
            heapq.heappush(self._stopped, (time.monotonic() + pause, pid, target))

    def _signal(self, action: ActionName, target: str, pid: int) -> bool:
        number = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}[action]
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            return False  # it exited on its own meanwhile
        record = ChaosAction(self.seed, len(self.actions), time.monotonic() - self._began, action, target, pid)
        self.actions.append(record)
        log.warning("%s", record)
        return True
