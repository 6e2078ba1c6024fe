"""``subagents top`` names a held root by its label, as ``ls``, ``tree`` and ``show`` do.

Found by a README probe: a root opened with ``open_root(label="host")`` is listed
``host`` by ``ls``, but ``top`` showed ``-`` (``"label": null`` in ``--json``) and
``top --label host`` left it out, because ``store/held.py`` took the label from the
descriptor alone, which a root does not have: its label is in its header. A real
host process holds the root; the real CLI reads the store.
"""

from __future__ import annotations

import json

from tests.supervisor.test_cli_control import host, ok  # noqa: F401  (host: the fixture, a live supervisor)


def test_top_shows_and_filters_a_held_root_by_its_label(host) -> None:  # noqa: F811
    store_path, ids, _proc = host
    rows = {r["id"]: r for r in json.loads(ok(store_path, "top", "--once", "--json"))}
    assert rows[ids["root"]]["label"] == "host"
    assert rows[ids["child"]]["label"] == "sleeper"
    text = ok(store_path, "top", "--once").splitlines()
    root_row = next(line.split() for line in text[1:] if ids["root"].startswith(line.split()[0]) and "root" in line.split())
    assert root_row[3:5] == ["root", "host"]
    filtered = json.loads(ok(store_path, "top", "--once", "--json", "--label", "host"))
    assert [r["id"] for r in filtered] == [ids["root"]]
