"""A record the host has no memory to frame says ``OUT_OF_MEMORY`` (still a ``MemoryError``), with nothing written.

Found by the edge probes: a one-shot ``start`` of a 16 MiB prompt under a low address-space limit
(``ulimit -v``) raised a bare ``MemoryError`` from msgpack, which no ``except SubagentError`` sees. The
store's framing is where it fails (a record is framed whole before a byte of it is written), so it is the
boundary that knows what could not be stored and that nothing was: it says so with a code, as a host that
cannot start a thread does. The store checks clean afterwards and the same supervisor serves the next call.
The host runs in a process of its own, its limit set a little above what it maps once it is open.

The one-shot's size check sizes a long prompt without framing it (``store/record_size.py``): the start of a
16 MiB prompt took about 49 MiB of address space to spare before that, 18 MiB since. So the limit here is
half the prompt's size, and the creation is where framing fails: it builds the new session's file whole
before any of it is written, and says ``OUT_OF_MEMORY`` as the check did (it raised a bare ``MemoryError``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HOST = r'''
import json, os, resource, sys, anyio
from subagents import Supervisor, SupervisorConfig, SubagentRequest, SubagentError
from subagents.supervisor import Provider, Capabilities

async def main(store: str) -> None:
    config = SupervisorConfig(pool_size=1, durability="none", max_record_bytes=64 << 20)
    async with Supervisor.open(store=store, config=config) as sup:
        sup.register_provider(Provider(name="echo", program="echo", capabilities=Capabilities.all()))
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="warm"))  # its threads are started
        await run.result(); await run.dispose()
        prompt = "x" * (16 << 20)
        with open(f"/proc/{os.getpid()}/status") as status:
            mapped = int(status.read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (8 << 20), resource.RLIM_INFINITY))
        try:
            await sup.start("echo", SubagentRequest(parent=root, prompt=prompt))
            answer = {"started": True}
        except SubagentError as exc:
            answer = {"code": exc.code, "memory_error": isinstance(exc, MemoryError), "text": str(exc)}
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        del prompt
        print(json.dumps(answer), flush=True)
        with anyio.fail_after(20):
            run = await sup.start("echo", SubagentRequest(parent=root, prompt="after"))
            result = await run.result()
            await run.dispose()
        print(json.dumps({"after": result.output, "children": len(await sup.list_children(root))}), flush=True)

anyio.run(main, sys.argv[1])
'''


def test_a_prompt_the_host_has_no_memory_to_frame_is_out_of_memory_and_nothing_is_written(tmp_path: Path) -> None:
    from subagents.store import check_store

    proc = subprocess.run([sys.executable, "-c", HOST, str(tmp_path / "store")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    refused, after = (json.loads(line) for line in proc.stdout.splitlines())
    assert refused["code"] == "OUT_OF_MEMORY" and refused["memory_error"], (refused, proc.stderr[-3000:])
    assert "nothing was written" in refused["text"], refused
    assert after == {"after": "after", "children": 2}, after  # the warm-up child and this one: none for the refused
    report = check_store(tmp_path / "store")
    assert report.clean, report.violations
