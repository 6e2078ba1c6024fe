"""The ``llm`` program against an endpoint whose reply is huge or never ends (127.0.0.1, a port the OS picks).

Found by reading the program: the client read a reply whole into the worker's memory before anything
looked at its size, so an endpoint answering with gigabytes (or a chunked body that streams forever, fast)
grew the worker until the machine killed it, and with it every other turn it ran. The stores here are made
with a 64 KiB record limit, so the reply the program reads stays about a megabyte; the bodies sent are 64 MiB
(or endless), and the worker's peak resident memory (``VmHWM``) must not grow by anything near that.
"""

from __future__ import annotations

import time
import zlib
from http.server import BaseHTTPRequestHandler
from typing import Any

import anyio
import pytest

from subagents.supervisor import Capabilities, Provider, SubagentRequest, Supervisor, SupervisorConfig
from subagents.worker.programs.llm import LlmProgram
from subagents.worker.programs.reply_cap import reply_limit

from .test_llm_faults import completion, endpoint, program, run_once  # noqa: F401 (endpoint: a fixture)

pytestmark = pytest.mark.anyio

LIMIT = 64 * 1024
MIB = 1024 * 1024
# how much the worker's peak may grow over a turn that reads a reply of about a megabyte (the client's buffers,
# the body's copies): far below the 64 MiB an unbounded read of the body alone costs
GROWTH = 24 * MIB
# an endless body's own stop, so a client that reads it all still ends: two seconds of it, at most
ENDLESS_S = 2.0


def huge(size: int, status: int = 200) -> Any:
    """An answer of ``size`` bytes (a JSON string that never closes, so no prefix of it parses), sent with its length."""
    def send(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(size))
        handler.end_headers()
        chunk = b'{"error": {"message": "' + b"x" * (MIB - 24)
        sent = 0
        try:
            while sent < size:
                piece = chunk[: min(MIB, size - sent)] if sent == 0 else b"x" * min(MIB, size - sent)
                handler.wfile.write(piece)
                sent += len(piece)
        except OSError:
            pass  # the client stopped reading: what the test wants
    return send


def endless(handler: BaseHTTPRequestHandler) -> None:
    """A chunked reply that never ends, 1 MiB at a time as fast as the client takes it (for ``ENDLESS_S``)."""
    handler.protocol_version = "HTTP/1.1"
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    piece = b"x" * MIB
    frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    handler.close_connection = True
    deadline = time.monotonic() + ENDLESS_S
    try:
        handler.wfile.write(b'6\r\n{"id":\r\n')
        while time.monotonic() < deadline:
            handler.wfile.write(frame)
    except OSError:
        pass


def endless_trickle(handler: BaseHTTPRequestHandler) -> None:
    """A chunked reply that never ends, a byte every 0.1 s (for 30 s): the cap is never reached."""
    handler.protocol_version = "HTTP/1.1"
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    handler.close_connection = True
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            handler.wfile.write(b"1\r\n \r\n")
            handler.wfile.flush()
            time.sleep(0.1)
    except OSError:
        pass


def gzipped(answer: tuple[int, dict[str, str], bytes]) -> tuple[int, dict[str, str], bytes]:
    """``answer`` with its body sent gzip-compressed (``Content-Encoding: gzip``)."""
    status, headers, body = answer
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return status, {**headers, "Content-Encoding": "gzip"}, packer.compress(body) + packer.flush()


def bomb(size: int, status: int = 200) -> tuple[int, dict[str, str], bytes]:
    """A gzip body of a quarter megabyte or so that decompresses to ``size`` bytes of spaces."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    piece = b" " * MIB
    body = b"".join(packer.compress(piece) for _ in range(size // MIB)) + packer.flush()
    return status, {"Content-Type": "application/json", "Content-Encoding": "gzip"}, body


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (``VmHWM``), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


async def turns_on_one_worker(tmp_path, llm: LlmProgram) -> tuple[Any, int, Any]:
    """On one worker: a warm-up turn, the turn under test, then one more; the tested turn's result, how much
    the worker's peak memory grew over it, and the last turn's result (the same worker still works)."""
    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none",
                                                                           max_record_bytes=LIMIT)) as sup:
        sup.register_provider(Provider(name="llm", program=llm, capabilities=Capabilities.all()))
        sup.register_provider(Provider(name="pid", program="tests.programs_for_tests:pid"))
        root = await sup.open_root()

        async def turn(provider: str) -> Any:
            run = await sup.start(provider, SubagentRequest(parent=root, prompt="go"))
            with anyio.fail_after(60):
                result = await run.result()
            await run.dispose()
            return result

        worker = int((await turn("pid")).output)
        warm = await turn("llm")
        assert (warm.stop_reason, warm.output) == ("completed", "warm"), warm
        before = peak_rss(worker)
        tested = await turn("llm")
        grew = peak_rss(worker) - before
        after = await turn("llm")
        assert int((await turn("pid")).output) == worker
    return tested, grew, after


async def test_a_reply_of_64_mib_is_not_read_whole(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers[:] = [completion("warm"), huge(64 * MIB), completion("next turn")]
    started = time.monotonic()
    result, grew, after = await turns_on_one_worker(tmp_path, program(base_url, max_retries=2))
    cap = reply_limit(LIMIT)
    assert (result.stop_reason, result.output) == ("error", ""), result
    assert result.diagnostic == (f"the model endpoint {base_url} answered with a reply of more than {cap} bytes, more than "
                                 f"a turn keeps (the store holds {LIMIT} bytes in one record): it was not read further")
    assert grew < GROWTH, f"the worker's peak memory grew by {grew / MIB:.1f} MiB"
    assert len(seen) == 3  # not retried: the same request gets the same reply
    assert (after.stop_reason, after.output) == ("completed", "next turn")
    assert time.monotonic() - started < 30


async def test_a_reply_that_streams_forever_is_cut_at_the_limit(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers[:] = [completion("warm"), endless, completion("next turn")]
    result, grew, after = await turns_on_one_worker(tmp_path, program(base_url, max_retries=0, timeout_s=30))
    assert (result.stop_reason, result.output) == ("error", ""), result
    assert result.diagnostic.startswith(f"the model endpoint {base_url} answered with a reply of more than "), result
    assert grew < GROWTH, f"the worker's peak memory grew by {grew / MIB:.1f} MiB"
    assert (after.stop_reason, after.output) == ("completed", "next turn")


async def test_an_error_body_of_64_mib_is_quoted_from_its_start(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers[:] = [completion("warm"), huge(64 * MIB, status=500), completion("next turn")]
    result, grew, after = await turns_on_one_worker(tmp_path, program(base_url, max_retries=0))
    assert result.stop_reason == "error", result
    assert result.diagnostic.startswith('the model endpoint failed (HTTP 500): {"error": {"message": "xxxx'), result
    assert result.diagnostic.endswith("x…") and len(result.diagnostic) < 400, result
    assert grew < GROWTH, f"the worker's peak memory grew by {grew / MIB:.1f} MiB"
    assert (after.stop_reason, after.output) == ("completed", "next turn")


async def test_a_reply_that_trickles_forever_in_chunks_ends_at_timeout_s(tmp_path, endpoint) -> None:
    """Below the cap, the deadline of each attempt (``timeout_s``) is what ends an endless body."""
    base_url, seen, answers = endpoint
    answers.append(endless_trickle)
    result, _, took = await run_once(tmp_path, program(base_url, timeout_s=1.0, max_retries=1))
    assert (result.stop_reason, result.diagnostic) == ("error", "the model endpoint did not answer within timeout_s=1 (after 1 retries)")
    assert took < 15 and len(seen) == 2


@pytest.mark.parametrize("status", [200, 500])
async def test_a_gzip_reply_that_decompresses_to_256_mib_is_cut_as_it_is_decompressed(tmp_path, endpoint, status) -> None:
    """The cap counts the body's bytes once decompressed, not as sent: a quarter megabyte of gzip is 256 MiB of body."""
    base_url, seen, answers = endpoint
    answers[:] = [gzipped(completion("warm")), bomb(256 * MIB, status), gzipped(completion("next turn"))]
    result, grew, after = await turns_on_one_worker(tmp_path, program(base_url, max_retries=0))
    assert result.stop_reason == "error", result
    if status == 200:
        assert result.diagnostic == (f"the model endpoint {base_url} answered with a reply of more than {reply_limit(LIMIT)} bytes, "
                                     f"more than a turn keeps (the store holds {LIMIT} bytes in one record): it was not read further")
    else:
        assert result.diagnostic == "the model endpoint failed (HTTP 500)", result  # spaces only: nothing to quote
    assert grew < GROWTH, f"the worker's peak memory grew by {grew / MIB:.1f} MiB"
    assert (after.stop_reason, after.output) == ("completed", "next turn")
