"""The README's "API in 20 lines" runs as written, and leaves nothing behind that keeps its root from ``gc``.

Found by a probe: the example's last ``followup`` produced a settlement notice nobody took, so ``gc`` kept the
root for good ("has 1 undelivered message(s)").
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from subagents.store import Store, pending, read_header, read_projection

REPO = Path(__file__).resolve().parents[2]


def test_the_api_example_runs_and_takes_every_message_it_causes(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## The API in 20 lines"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "done" and "finished" in lines[1], lines
    st = Store(tmp_path / ".subagents", create=False)
    [root] = [s for s in st.session_ids() if read_header(st, s).parent_session is None]
    p = read_projection(st, root)
    assert pending(st, root, consumed=p.consumed, last_consumed_id=p.last_message_id, mailbox_end=p.mailbox_end) == []
