"""``reply_cap``'s decompression of a body, piece by piece: what the cap counts is the body as decompressed."""

from __future__ import annotations

import os
import random
import zlib

import pytest

from subagents.worker.programs.reply_cap import Inflater


class NotEncoded(Exception):
    """Stands for the HTTP layer's ``DecodingError``."""


@pytest.mark.parametrize("encoding, wbits", [("gzip", 16 + zlib.MAX_WBITS), ("deflate", zlib.MAX_WBITS), ("deflate", -zlib.MAX_WBITS)],
                         ids=["gzip", "deflate", "raw-deflate"])
def test_a_body_decompresses_whole_in_pieces_of_at_most_64_kib(encoding: str, wbits: int) -> None:
    body = os.urandom(100_000) + b" " * 3_000_000 + b"abc" * 50_000
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    sent = packer.compress(body) + packer.flush()
    inflater, pieces, at = Inflater(encoding, NotEncoded), [], 0
    chosen = random.Random(7)
    while at < len(sent):
        size = chosen.choice([2, 7, 100, 4096, 65536])
        pieces += list(inflater.pieces(sent[at:at + size]))
        at += size
    assert b"".join(pieces) == body
    assert max(len(piece) for piece in pieces) <= 64 * 1024


def test_a_body_that_is_not_what_its_encoding_says_raises_the_layers_error() -> None:
    with pytest.raises(NotEncoded, match="the body is not the gzip it says it is"):
        list(Inflater("gzip", NotEncoded).pieces(b'{"choices": []}'))
