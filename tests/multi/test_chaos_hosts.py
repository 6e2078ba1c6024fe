"""``Chaos`` on supervisor processes (issue 16): hosts killed and stopped at seeded times, the store checks clean.

Three hosts (Supervisors in other processes) run the ``chaos`` workload of
``_driver.py`` on one store while ``Chaos`` SIGKILLs some of them and
SIGSTOPs / SIGCONTs others. Every action names its seed; every killed host
really died of SIGKILL; at the end the survivors close, no process of any host
is left, and ``check_store`` finds the store clean: a killed supervisor's
leases are harmless, its half-done creations and turns are torn or counted.
"""

from __future__ import annotations

import time

from subagents.store import Store, check_store
from subagents.testing import Chaos, processes

from ._driver import HostFactory, wait_gone

SEED = 20261133  # draws stop, kill, stop: both kinds, and the same ones on every run


def test_chaos_on_supervisor_processes(tmp_path, hosts: HostFactory) -> None:
    st = Store(tmp_path / "store", durability="none")
    group = [hosts.start(st.root, durability="none", lease_ttl_s=5.0) for _ in range(3)]
    for n, host in enumerate(group):
        host.call("chaos", roots=[], children=[], new_roots=1, max_children=3, steps=20, lanes=2, seed=SEED + n, max_sleep_ms=20)
    chaos = Chaos({"supervisor": processes(*(h.proc for h in group))}, seed=SEED, interval_s=(0.1, 0.4),
                  stop_for_s=(0.05, 0.3), max_actions=3)
    with chaos:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (sum(a.action != "cont" for a in chaos.actions) < 3 or any(h.alive and not h.events("chaos-done") for h in group)):
            time.sleep(0.01)  # polling the hosts' progress and the chaos under a deadline
    assert [a.action for a in chaos.actions if a.action != "cont"] == ["stop", "kill", "stop"], chaos.summary()
    assert all(a.seed == SEED for a in chaos.actions)
    killed = {a.pid for a in chaos.actions if a.action == "kill"}
    for host in group:
        if host.pid in killed:
            assert host.proc.wait(timeout=10) == -9, chaos.summary()
        else:
            assert host.events("chaos-done"), host.stderr_tail()
            assert host.close() == 0, host.stderr_tail()
    for host in group:
        host.kill()  # reaps the killed ones and closes their pipes
        wait_gone(host.tag, timeout=10.0)
    report = check_store(st.root)
    assert report.clean, f"{report}\n{chaos.summary()}"
    assert report.counts.sessions > 3, str(report)
