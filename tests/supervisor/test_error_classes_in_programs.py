"""A supervisor's error reaches a program as the class the supervisor raised, whatever the program imported.

Errors cross the worker pipe as data naming their class, and were rebuilt only as a class already
loaded in the worker: a program that had not imported ``subagents`` (or ``SubagentDepthError``)
got the root ``SubagentError``, so ``except PermissionError`` missed an ``UNAUTHORIZED`` that the
same code on the host caught, and the class depended on what the program happened to import.
"""

from __future__ import annotations

import pytest

from subagents.supervisor import SubagentRequest

from ..conftest import helper, open_supervisor

pytestmark = pytest.mark.anyio


async def test_a_program_gets_the_supervisors_error_classes_without_importing_them(tmp_path) -> None:
    from subagents.supervisor import Capabilities, Provider

    async with open_supervisor(tmp_path) as sup:
        sup.register_provider(Provider(name="catches", program=helper("names_the_errors_it_catches"), capabilities=Capabilities.all()))
        root = await sup.open_root()
        run = await sup.start("catches", SubagentRequest(parent=root, prompt="go"))
        result = await run.result()
        await run.dispose()
    assert result.stop_reason == "completed", result.diagnostic
    assert result.output.splitlines() == ["SubagentDepthError 2", "PermissionError UnauthorizedError"]
