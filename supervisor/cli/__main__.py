"""``python -m subagents.supervisor.cli``: the same as the ``subagents`` script."""

import sys

from .main import main

sys.exit(main())
