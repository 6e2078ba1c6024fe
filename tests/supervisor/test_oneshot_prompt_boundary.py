"""A one-shot prompt whose record frames to exactly the store's limit is accepted; one byte more is refused.

Pins the boundary of the size check a one-shot ``start`` makes before it creates anything (a prompt no record
holds is ``MESSAGE_TOO_LARGE``, naming the record's size), so that a cheaper way of sizing the record gives
the same answer and the same words, for text of one byte a character and of several.
"""

from __future__ import annotations

import os
import re

import pytest

from subagents.store import SubagentError, check_store
from subagents.supervisor import SubagentRequest

from ..conftest import open_supervisor

pytestmark = pytest.mark.anyio

LIMIT = 4096
REFUSED = re.compile(
    r"a record of the prompt of \w+ of (\d+) bytes exceeds the store's record size limit of 4096 bytes \(max_record_bytes\)$"
)


def _prompt(pad: str) -> str:
    """A script that returns ``ok``, carrying ``pad`` (a script's keys besides ``script`` are not read)."""
    return '{"script": [{"return": "ok"}], "pad": "' + pad + '"}'


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


async def _refused_size(sup, root: str, prompt: str) -> int:
    """The size a refusal names for ``prompt``, after checking its code and words; nothing is created."""
    before = sorted(os.listdir(sup.store.sessions_dir))
    with pytest.raises(SubagentError) as caught:
        await sup.start("script", SubagentRequest(parent=root, prompt=prompt))
    assert caught.value.code == "MESSAGE_TOO_LARGE", caught.value
    match = REFUSED.search(str(caught.value))
    assert match is not None, str(caught.value)
    assert sorted(os.listdir(sup.store.sessions_dir)) == before
    return int(match.group(1))


async def _accepted(sup, root: str, prompt: str) -> None:
    run = await sup.start("script", SubagentRequest(parent=root, prompt=prompt))
    result = await run.result()
    await run.dispose()
    assert (result.stop_reason, result.output) == ("completed", "ok"), result


@pytest.mark.parametrize("char", ["z", "é", "€", "😀"])
async def test_a_prompt_framed_to_exactly_the_limit_is_accepted_and_one_byte_more_is_refused(tmp_path, char: str) -> None:
    async with open_supervisor(tmp_path, max_record_bytes=LIMIT) as sup:
        root = await sup.open_root()
        probe = _prompt(char * LIMIT)
        envelope = await _refused_size(sup, root, probe) - _size(probe)  # what the record adds to the prompt's bytes
        room = LIMIT - envelope - _size(_prompt(""))  # the bytes of padding that frame to exactly the limit
        width = _size(char)
        exact = _prompt(char * (room // width) + "z" * (room % width))
        assert _size(exact) + envelope == LIMIT
        await _accepted(sup, root, exact)
        assert await _refused_size(sup, root, _prompt(char * (room // width) + "z" * (room % width + 1))) == LIMIT + 1
        assert await _refused_size(sup, root, _prompt(char * (room // width + 1) + "z" * (room % width))) == LIMIT + width
        assert check_store(sup.store).clean


async def test_a_prompt_with_a_lone_surrogate_is_refused_as_before_whatever_its_size(tmp_path) -> None:
    """Text msgpack cannot encode (a lone surrogate) is ``INVALID_RECORD``, whether the size check frames it or
    the creation does; nothing is created either way."""
    async with open_supervisor(tmp_path, max_record_bytes=LIMIT) as sup:
        root = await sup.open_root()
        before = sorted(os.listdir(sup.store.sessions_dir))
        surrogate = "UnicodeEncodeError: 'utf-8' codec can't encode character '\\ud800' in position 39: surrogates not allowed"
        for pad, what in (("\ud800", 'a "message/accepted" event'), ("\ud800" + "z" * LIMIT, r"a record of the prompt of \w+")):
            with pytest.raises(SubagentError) as caught:
                await sup.start("script", SubagentRequest(parent=root, prompt=_prompt(pad)))
            assert caught.value.code == "INVALID_RECORD", caught.value
            assert re.fullmatch(f"{what} cannot be stored: {re.escape(surrogate)}", str(caught.value)), str(caught.value)
        assert sorted(os.listdir(sup.store.sessions_dir)) == before
