"""``check_store`` on a store another process is writing (issue 16): clean at every reading.

A host process runs a real ``Supervisor`` with the ``chaos`` workload of
``_driver.py`` (continuable children, follow-ups, one-shot children and
grandchildren, on two lanes). Meanwhile this process checks the store again
and again: every reading lands somewhere in the middle of creations, turns,
message acceptances and lease changes, and each must be clean.
"""

from __future__ import annotations

import time

from subagents.store import Store, check_store

from ._driver import HostFactory


def test_checks_during_a_live_run_are_clean(tmp_path, hosts: HostFactory) -> None:
    """Readings taken while a supervisor writes find no violation, and they saw the run grow."""
    st = Store(tmp_path / "store", durability="none")
    host = hosts.start(st.root, durability="none", pool_size=2)
    host.call("chaos", roots=[], children=[], new_roots=2, max_children=4, steps=25, lanes=2, seed=7, max_sleep_ms=20)
    readings = []
    deadline = time.monotonic() + 120
    while not host.events("chaos-done") and time.monotonic() < deadline:
        report = check_store(st.root)
        assert report.clean, str(report)
        readings.append(report.counts)
    assert host.events("chaos-done"), host.stderr_tail()
    assert len(readings) >= 3, f"only {len(readings)} readings during the run"
    assert readings[-1].sessions > readings[0].sessions, "the readings did not overlap the writing"
    assert host.close() == 0, host.stderr_tail()
    final = check_store(st.root)
    assert final.clean, str(final)
    assert final.counts.leases_live == 0 and final.counts.messages_consumed > 0, str(final)
