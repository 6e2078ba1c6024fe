"""The ``subagents`` command line: a demo, one-off runs, control of children, views of a store.

General layout (the CLI parses, calls the library, and renders; it holds no store logic):

* ``main``       — the entry point, the error boundary (exit codes, ``error: CODE: message``)
  and ``build_parser``, which asks each verb group to register its verbs;
* ``parser``     — the global options and the ``Verbs`` helper verb groups register with;
* ``invocation`` — what a verb receives: its arguments, the layered config, the output;
* ``listing``    — read-only views: ``ls``, ``tree``, ``show``, ``log``, ``top``;
* ``control``    — ``send``, ``interrupt``, ``drain``: children hosted by any process;
* ``demo``       — ``demo`` and ``run``: the verbs that start workers and run turns;
* ``maintenance``— ``store fsck``, ``store reindex``, ``config show``;
* ``render`` / ``top_view`` / ``config_view`` — every byte written to stdout; ``log_format`` — stderr logging.

Only this package prints. Listings read the store directly (``subagents.store``'s
read-only views) and never write a byte; ``demo``, ``run`` and the control verbs
open a ``Supervisor``; only they and ``store fsck --repair`` / ``store reindex`` write.
"""

from .main import build_parser, main

__all__ = ["main", "build_parser"]
