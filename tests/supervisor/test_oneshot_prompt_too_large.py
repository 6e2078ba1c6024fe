"""A one-shot child's prompt too large for one store record is ``MESSAGE_TOO_LARGE``, as a continuable one's is.

Found by a probe acting as a hostile model: the same oversized prompt given to the delegation tool
answered ``MESSAGE_TOO_LARGE: a record of mailbox/<id> ...`` for a continuable child and
``RECORD_TOO_LARGE: a "message/accepted" event of ...`` for a one-shot one, naming a log event the
model never sees. Both now say ``MESSAGE_TOO_LARGE``, and nothing is written.
"""

from __future__ import annotations

import os

import pytest

from subagents.store import SubagentError, check_store
from subagents.supervisor import SubagentRequest, Supervisor, SupervisorConfig

from ..conftest import all_providers

pytestmark = pytest.mark.anyio

LIMIT = 4096


async def test_a_one_shot_prompt_larger_than_a_record_is_message_too_large_and_writes_nothing(tmp_path) -> None:
    config = SupervisorConfig(pool_size=1, durability="none", max_record_bytes=LIMIT)
    async with Supervisor.open(store=tmp_path / "st", config=config) as sup:
        for provider in all_providers():
            sup.register_provider(provider)
        root = await sup.open_root()
        before = sorted(os.listdir(sup.store.sessions_dir))
        with pytest.raises(SubagentError) as caught:
            await sup.start("script", SubagentRequest(parent=root, prompt="z" * (2 * LIMIT)))
        assert caught.value.code == "MESSAGE_TOO_LARGE"
        assert "message/accepted" not in str(caught.value)
        assert f"exceeds the store's record size limit of {LIMIT} bytes" in str(caught.value)
        assert sorted(os.listdir(sup.store.sessions_dir)) == before
        assert check_store(sup.store).clean
