"""The ``subagents`` script's entry point: the CLI's error boundary reaches back over its own loading.

The CLI's modules take a noticeable fraction of a second to load (pydantic,
msgpack, the store); a Ctrl-C in that time would otherwise end in a
``KeyboardInterrupt`` traceback from the import, before the CLI's boundary in
``subagents.supervisor.cli.main`` exists. This module imports nothing heavy
(``subagents`` resolves its names lazily), so the window left is the
interpreter's own start.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

EXIT_INTERRUPTED = 130  # as the CLI's boundary answers a Ctrl-C: 128 + SIGINT


def main() -> int:
    try:
        from subagents.supervisor.cli.main import main as run
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return run()
