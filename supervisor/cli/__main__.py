"""``python -m subagents.supervisor.cli``: the same as the ``subagents`` script."""

import sys

from subagents.console import main

sys.exit(main())
