"""A host under a low open-file limit is not starved of descriptors by the supervisor's own cache.

Found by a probe (``ulimit -n 128``, 80 continuable children resident, two follow-ups each): the
supervisor keeps a resident child's mailbox open between acceptances (two descriptors each) for up
to 64 children, 128 descriptors whatever the limit. With 128 allowed, that cache took every one:
follow-ups failed ``SESSION_UNAVAILABLE`` (Too many open files), every settled child's lease release
waited 30 s for a descriptor that nothing gave back, and the host's ``wait_for_message`` failed.
The cache is now bounded by the process's soft limit, and gives its descriptors back when an open
fails for want of one.

The host runs in a process of its own, its limit set there before the supervisor opens.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from subagents.store import check_store

HOST = textwrap.dedent(
    """
    import json, os, resource, sys
    import anyio
    from subagents import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig

    store, gate, limit, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    def S(*actions):
        return json.dumps({"script": list(actions)})

    async def main():
        config = SupervisorConfig(pool_size=1, turns_per_worker=n, durability="none")
        async with Supervisor.open(store=store, config=config) as sup:
            sup.register_provider(Provider(name="s", program="script", capabilities=Capabilities.all(), continuable=True))
            root = await sup.open_root(label="main")
            kids = [
                (await sup.start_continuable(ContinuableSpec(parent=root, provider="s", label=f"k{i}",
                                                             prompt=S({"hold": gate}, {"return": "first"}))))[0]
                for i in range(n)
            ]
            acked = 0
            for round in range(2):
                for kid in kids:
                    await sup.followup(root, kid, S({"return": f"again {round}"}))
                    acked += 1
            os.rename(gate + ".ready", gate)  # no descriptor needed to open the gate
            notices = []
            with anyio.fail_after(60):
                while len(notices) < n:
                    notices += [m for m in await sup.wait_for_message(root, timeout_s=60)
                                if m.source.get("kind") == "subagent-settled"]
            rows = await sup.list_children(root.id)
            print(json.dumps({"acked": acked, "notices": len(notices),
                              "outcomes": sorted({r.outcome for r in rows}), "open": sup.statistics().open_mailboxes}))

    anyio.run(main)
    """
)


def test_many_resident_children_under_a_low_descriptor_limit_leave_the_host_descriptors(tmp_path: Path) -> None:
    script = tmp_path / "host.py"
    script.write_text(HOST)
    gate = tmp_path / "gate"
    (tmp_path / "gate.ready").touch()
    store = tmp_path / "store"
    n = 48
    done = subprocess.run([sys.executable, str(script), str(store), str(gate), "100", str(n)],
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["acked"] == 2 * n and result["notices"] == n, result
    assert result["outcomes"] == ["completed"], result
    assert result["open"] <= 100 // 16, result  # the cache holds at most an eighth of the limit
    assert "waits: this process has no file descriptor left" not in done.stderr, done.stderr[-3000:]
    report = check_store(str(store))
    assert report.clean, str(report)
    assert report.counts.messages_pending == 0, str(report)
