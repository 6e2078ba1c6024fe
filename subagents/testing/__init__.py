"""subagents.testing: a kit for stress-testing your own agent programs under pytest.

* ``check_store(path)`` — every invariant of a store, checked from its files alone,
  safely while other processes still write (``subagents.store.check``); a stress
  test asserts ``check_store(path).clean``.
* ``Chaos`` — kills (SIGKILL) or stops (SIGSTOP/SIGCONT) processes of the test at
  random, seeded times, logging each action with its seed; ``workers_of(sup)`` and
  ``processes(*popen)`` name what it may hit.
* the pytest plugin (``subagents.testing.plugin``, loaded through the ``pytest11``
  entry point): the fixtures ``subagents_store``, ``shared_subagents_store``,
  ``supervisor``, ``subagents_root``, ``subagents_chaos`` and the ``subagents`` marker.

Test programs need no model: the built-in ``script`` program runs a JSON action list
(README, "Testing your agents").
"""

from __future__ import annotations

from subagents.store.check import CheckCounts, CheckReport, Violation, check_store

from .chaos import Chaos, ChaosAction, processes, workers_of

__all__ = ["check_store", "CheckReport", "CheckCounts", "Violation", "Chaos", "ChaosAction", "workers_of", "processes"]
