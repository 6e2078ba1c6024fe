"""The store service and its remote writer, without a cluster: one in flight, coalesced, seq- and fence-checked.

The service runs on an event loop of its own thread, as an actor would, and
the writer's transport submits each call to that loop: calls from several
threads really run concurrently on the service, as they do on an async actor.
"""

from __future__ import annotations

import asyncio
import fcntl
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from subagents.store import Store, acquire_lease, create_session, inspect, read_header, read_lease, read_projection
from subagents.store.errors import FencedError, RecordTooLargeError, SubagentError
from subagents.store.log import SeqMismatchError
from subagents.worker.service_writer import ServiceSessions, ServiceWriter, StoreServiceError
from subagents.worker.store_service import StoreService, decode_reply, encode_request, join_events, pack_event, pack_events, unpack_events

DEADLINE_S = 20.0


class ServiceHost:
    """A ``StoreService`` on its own event loop thread; ``call`` is a blocking transport to it, in the
    bytes a Ray transport carries (``encode_request`` / ``StoreService.call`` / ``decode_reply``)."""

    def __init__(self, store: Store) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.service = self.run(lambda: _make(store))
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.gate: threading.Event | None = None  # when set up, appends wait for it (a slow service)
        self.release_gate: threading.Event | None = None  # the same for a turn's release (close_writer with release_owner)

    def run(self, factory: Callable[[], Any]) -> Any:
        async def go() -> Any:
            return await factory()
        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(DEADLINE_S)

    def call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append((method, kwargs))
        if method == "append" and self.gate is not None:
            assert self.gate.wait(DEADLINE_S)
        if method == "close_writer" and kwargs.get("release_owner") and self.release_gate is not None:
            assert self.release_gate.wait(DEADLINE_S)
        return decode_reply(self.run(lambda: self.service.call(encode_request(method, kwargs))))

    def close(self) -> None:
        self.service.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE_S)
        self.loop.close()


async def _make(store: Store) -> StoreService:
    return StoreService(store.root, store.durability.name)


@pytest.fixture
def st(tmp_path: Path) -> Store:
    return Store(tmp_path / "store", durability="strict")


@pytest.fixture
def host(st: Store) -> Iterator[ServiceHost]:
    h = ServiceHost(st)
    yield h
    h.close()


def wait_for(predicate: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.001)


def leased(st: Store, sid: str) -> int:
    create_session(st, sid)
    return acquire_lease(st, sid, "01OWNER").epoch


def appends(host: ServiceHost) -> list[dict[str, Any]]:
    return [kwargs for method, kwargs in host.calls if method == "append"]


def test_appends_reach_the_log_with_contiguous_seqs(st: Store, host: ServiceHost) -> None:
    epoch = leased(st, "s1")
    writer = ServiceSessions(host.call).open_writer("s1", epoch=epoch)
    records = writer.append([("turn/start", {"message_id": "m"}), ("assistant/message", {"text": "hi"})])
    assert [r["seq"] for r in records] == [0, 1]
    writer.append([("turn/end", {"stop_reason": "completed", "diagnostic": None})], commit=True)
    asyncio.run(writer.flush())
    writer.close()
    events = inspect(st, "s1").events
    assert [(e["seq"], e["type"], e["epoch"]) for e in events] == [(0, "turn/start", epoch), (1, "assistant/message", epoch), (2, "turn/end", epoch)]
    assert all(isinstance(e["ts"], float) for e in events)  # stamped on the store's host
    assert ServiceSessions(host.call).history("s1") == events
    assert host.service.statistics()["open_writers"] == 0


def test_queued_appends_coalesce_behind_the_one_in_flight(st: Store, host: ServiceHost) -> None:
    """While the first batch is in flight, ten more appends queue and go out as ONE call at its first_seq."""
    epoch = leased(st, "s1")
    writer = ServiceSessions(host.call).open_writer("s1", epoch=epoch)
    host.gate = threading.Event()
    writer.append([("turn/start", {"message_id": "m"})])
    wait_for(lambda: appends(host), "the sender to pick the first batch up")
    for i in range(10):
        writer.append([("assistant/message", {"text": str(i)})])
    host.gate.set()
    asyncio.run(writer.flush())
    sent = appends(host)
    assert [(a["first_seq"], len(a["events"]) > 0) for a in sent] == [(0, True), (1, True)]
    assert writer.batches_sent == 2
    writer.close()
    assert [e["seq"] for e in inspect(st, "s1").events] == list(range(11))


def test_reordered_batches_are_refused_and_the_log_stays_contiguous(st: Store, host: ServiceHost) -> None:
    """Batches sent out of order (as an async actor may run them) land only at their own first_seq."""
    epoch = leased(st, "s1")
    host.call("open_writer", writer_id="w", session_id="s1", epoch=epoch)
    batch = pack_events([("assistant/message", {"text": "x"})])
    late = host.call("append", writer_id="w", first_seq=1, events=batch, commit=False)  # overtook seq 0
    assert late["error"]["code"] == "SEQ_MISMATCH"
    assert "next_seq" in host.call("append", writer_id="w", first_seq=0, events=batch, commit=False)
    replay = host.call("append", writer_id="w", first_seq=0, events=batch, commit=False)  # a retried duplicate
    assert replay["error"]["code"] == "SEQ_MISMATCH"
    assert [e["seq"] for e in inspect(st, "s1").events] == [0]


def test_concurrent_calls_on_one_writer_never_interleave(st: Store, host: ServiceHost) -> None:
    """Twenty batches each claiming the next seq, from twenty threads at once: exactly one lands per seq."""
    epoch = leased(st, "s1")
    host.call("open_writer", writer_id="w", session_id="s1", epoch=epoch)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def send(seq: int) -> None:
        reply = host.call("append", writer_id="w", first_seq=seq, events=pack_events([("assistant/message", {"text": str(seq)})]), commit=False)
        with lock:
            results.append(reply)

    threads = [threading.Thread(target=send, args=(seq,)) for seq in reversed(range(20))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    events = inspect(st, "s1").events
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert all(e["data"]["text"] == str(e["seq"]) for e in events)  # each batch landed at the seq it claimed
    assert sum(1 for r in results if "next_seq" in r) == len(events)
    assert all(r["error"]["code"] == "SEQ_MISMATCH" for r in results if "error" in r)


def test_a_zombie_writer_is_fenced_after_takeover(st: Store, host: ServiceHost) -> None:
    """The supervisor takes the lease at epoch + 1; the old writer's next batch gets FencedError, and
    everything queued behind it is dropped, so the log stays a prefix of what the zombie wrote."""
    epoch = leased(st, "s1")
    zombie = ServiceSessions(host.call).open_writer("s1", epoch=epoch)
    zombie.append([("turn/start", {"message_id": "m"})])
    asyncio.run(zombie.flush())
    assert acquire_lease(st, "s1", "01OWNER").epoch == epoch + 1  # fence before repair
    zombie.append([("assistant/message", {"text": "late"})])
    with pytest.raises(FencedError):
        asyncio.run(zombie.flush())
    with pytest.raises(FencedError):
        zombie.append([("assistant/message", {"text": "later"})])
    zombie.close()
    assert [e["type"] for e in inspect(st, "s1").events] == ["turn/start"]


def test_opening_a_taken_over_session_is_fenced(st: Store, host: ServiceHost) -> None:
    epoch = leased(st, "s1")
    acquire_lease(st, "s1", "01OWNER")
    with pytest.raises(FencedError):
        ServiceSessions(host.call).open_writer("s1", epoch=epoch)


def test_a_seq_mismatch_from_the_service_breaks_the_writer(st: Store, host: ServiceHost) -> None:
    """Another writer of the same epoch appended behind our back: our batch is refused, never misplaced."""
    epoch = leased(st, "s1")
    ours = ServiceSessions(host.call).open_writer("s1", epoch=epoch)
    other = ServiceSessions(host.call).open_writer("s1", epoch=epoch)
    other.append([("turn/start", {"message_id": "m"})])
    asyncio.run(other.flush())
    ours.append([("turn/start", {"message_id": "n"})])
    with pytest.raises(SeqMismatchError):
        asyncio.run(ours.flush())
    ours.close()
    other.close()
    assert [e["data"]["message_id"] for e in inspect(st, "s1").events] == ["m"]


def test_a_dead_service_is_a_typed_error(st: Store) -> None:
    def dead(method: str, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("the actor died")

    with pytest.raises(StoreServiceError, match="actor died") as info:
        ServiceSessions(dead).open_writer("s1", epoch=1)
    assert info.value.code == "STORE_SERVICE_FAILED"
    writer = ServiceWriter(dead, "s1", 1, "w", 0)
    writer.append([("turn/start", {"message_id": "m"})])
    with pytest.raises(StoreServiceError):
        asyncio.run(writer.flush())
    writer.close()


def _creator_state(st: Store, session_id: str) -> dict[str, Any]:
    """The ``TurnSpec.log_state`` a supervisor hands the first turn of a session it just created."""
    create_session(st, session_id, lease_owner="01CREATOR", events=[("approval/policy", {"policy": "never", "source": "delegation"})])
    return {"header": read_header(st, session_id).to_record(), "projection": read_projection(st, session_id).to_record()}


def test_a_writer_given_its_creators_log_state_opens_with_its_first_append(st: Store, host: ServiceHost) -> None:
    """No round trip of its own to open: the first batch carries the open, and the service attaches to
    the log on the store's host; the seqs continue the creator's records."""
    state = _creator_state(st, "s1")
    writer = ServiceSessions(host.call).open_writer("s1", epoch=1, log_state=state)
    assert host.calls == []
    writer.append([("turn/start", {"message_id": "m"}), ("assistant/message", {"text": "hi"})], commit=True)
    asyncio.run(writer.flush())
    writer.close()
    assert [method for method, _ in host.calls] == ["append", "close_writer"]
    events = inspect(st, "s1").events
    assert [e["seq"] for e in events] == list(range(len(events))) and events[-1]["data"]["text"] == "hi"


def test_a_lazily_opened_writer_is_fenced_by_a_takeover_before_its_first_append(st: Store, host: ServiceHost) -> None:
    state = _creator_state(st, "s1")
    writer = ServiceSessions(host.call).open_writer("s1", epoch=1, log_state=state)
    assert acquire_lease(st, "s1", "01OWNER").epoch == 2
    writer.append([("turn/start", {"message_id": "m"})])
    with pytest.raises(FencedError):
        asyncio.run(writer.flush())
    writer.close()
    assert [e["type"] for e in inspect(st, "s1").events] == ["approval/policy"]
    assert host.run(lambda: _statistics(host.service))["open_writers"] == 0  # the failed open is closed too


def test_a_log_state_that_does_not_parse_opens_in_a_round_trip(st: Store, host: ServiceHost) -> None:
    _creator_state(st, "s1")
    writer = ServiceSessions(host.call).open_writer("s1", epoch=1, log_state={"header": {"junk": 1}, "projection": {}})
    assert [method for method, _ in host.calls] == ["open_writer"]
    writer.close()


async def _statistics(service: StoreService) -> dict[str, Any]:
    return service.statistics()


def test_the_release_and_the_close_at_turn_end_are_one_call(st: Store, host: ServiceHost) -> None:
    """Issue 11: a one-shot turn's last act on its log (release its lease, close its writer) is one
    round trip to the store service, not two; the lease is released and the service's writer closed."""
    state = _creator_state(st, "s1")
    writer = ServiceSessions(host.call).open_writer("s1", epoch=1, log_state=state)
    writer.append([("turn/start", {"message_id": "m"}), ("turn/end", {"stop_reason": "completed", "diagnostic": None})], commit=True)
    asyncio.run(writer.flush())
    host.calls.clear()
    writer.release_lease("01CREATOR")
    writer.close()
    assert [method for method, _ in host.calls] == ["close_writer"]
    lease = read_lease(st, "s1")
    assert lease is not None and (lease.state, lease.epoch) == ("released", 1)
    assert host.run(lambda: _statistics(host.service))["open_writers"] == 0
    with pytest.raises(SubagentError, match="closed"):
        writer.append([("assistant/message", {"text": "after the release"})])


def test_a_release_after_a_takeover_is_fenced_and_still_closes_the_writer_in_that_call(st: Store, host: ServiceHost) -> None:
    """The lease moved on (epoch + 1) between the closing commit and the release: ``FencedError``, the
    new holder's lease untouched, and the service's writer closed by that same call."""
    state = _creator_state(st, "s1")
    writer = ServiceSessions(host.call).open_writer("s1", epoch=1, log_state=state)
    writer.append([("turn/start", {"message_id": "m"})], commit=True)
    asyncio.run(writer.flush())
    assert acquire_lease(st, "s1", "01OWNER").epoch == 2
    host.calls.clear()
    with pytest.raises(FencedError):
        writer.release_lease("01CREATOR")
    writer.close()
    assert [method for method, _ in host.calls] == ["close_writer"]
    lease = read_lease(st, "s1")
    assert lease is not None and (lease.owner, lease.epoch) == ("01OWNER", 2) and lease.state != "released"
    assert host.run(lambda: _statistics(host.service))["open_writers"] == 0


def test_a_writer_that_never_sent_a_batch_still_releases(st: Store, host: ServiceHost) -> None:
    """Not open on the service yet (its first batch opens it): the release goes alone, and nothing is closed there."""
    state = _creator_state(st, "s1")
    writer = ServiceSessions(host.call).open_writer("s1", epoch=1, log_state=state)
    writer.release_lease("01CREATOR")
    writer.close()
    assert [method for method, _ in host.calls] == ["release_lease"]
    lease = read_lease(st, "s1")
    assert lease is not None and lease.state == "released"


def test_events_packed_one_by_one_join_into_the_batch_pack_events_makes() -> None:
    """The writer packs each event once, when appended; the batch it sends is the same bytes as packing it whole."""
    batch = [("turn/start", {"message_id": "m"}), ("assistant/message", {"text": "h\u00e9", "raw": b"\x00\x01"})]
    joined = join_events([pack_event(kind, data) for kind, data in batch])
    assert joined == pack_events(batch)
    assert unpack_events(joined) == batch
    assert unpack_events(join_events([])) == []


def test_a_call_the_service_does_not_have_is_refused(st: Store, host: ServiceHost) -> None:
    with pytest.raises(ValueError, match="no call"):
        host.run(lambda: host.service.call(encode_request("delete_everything", {})))


def test_a_cancelled_append_holds_its_writer_until_the_write_is_over(st: Store, host: ServiceHost) -> None:
    """The append runs in the service's threads; its caller cancelled meanwhile (an actor call cancelled)
    must not let the next call on that writer run beside it: the cancelled call ends only with the write."""
    epoch = leased(st, "s1")
    host.call("open_writer", writer_id="w", session_id="s1", epoch=epoch)
    batch = pack_events([("assistant/message", {"text": "x"})])
    with open(st.session_path("s1"), "rb") as held:  # the session's lock is an flock on its file (FORMAT.md §7): the append waits for it
        fcntl.flock(held, fcntl.LOCK_EX)
        task: list[asyncio.Task[Any]] = []
        host.loop.call_soon_threadsafe(lambda: task.append(host.loop.create_task(host.service.append("w", 0, batch, True))))
        wait_for(lambda: host.service.statistics()["in_threads"] == 1, "the append to reach the service's threads")
        host.loop.call_soon_threadsafe(task[0].cancel)
        host.run(lambda: asyncio.sleep(0))  # the cancellation delivered
        assert not task[0].done()  # still waiting for its write, so the writer's lock is still held
        fcntl.flock(held, fcntl.LOCK_UN)
    wait_for(lambda: task[0].done(), "the cancelled append to end")
    assert task[0].cancelled()
    assert [e["seq"] for e in inspect(st, "s1").events] == [0]  # the write itself went through, once
    assert "next_seq" in host.call("append", writer_id="w", first_seq=1, events=batch, commit=False)


def test_a_remote_release_does_not_hold_up_the_other_turns_of_the_worker(st: Store, host: ServiceHost) -> None:
    """A worker with a remote store runs several turns on one event loop (``turns_per_worker``): a
    turn's release and close are round trips to the store's host, made off that loop, so another
    turn goes on while one waits for its release."""
    from subagents.worker import TurnControl, run_turn
    from tests.worker.test_turn import FakeRpc, make_spec

    epochs = {sid: leased(st, sid) for sid in ("01SLOWRELEASE", "01OTHERTURN")}
    host.release_gate = threading.Event()
    other_done = threading.Event()
    progressed: list[bool] = []

    def watchdog() -> None:  # lets the slow release go once the other turn ended, or after a deadline
        wait_for(lambda: any(m == "close_writer" and k.get("release_owner") for m, k in host.calls), "the slow turn's release")
        progressed.append(other_done.wait(5.0))
        host.release_gate.set()

    async def main() -> None:
        sessions = ServiceSessions(host.call)

        async def one(sid: str, **fields: Any) -> None:
            spec = make_spec(st, epochs[sid], "echo", session_id=sid, **fields)
            await run_turn(spec, TurnControl(max_steps=spec.budget.max_steps), FakeRpc(), sessions=sessions)

        async def other() -> None:
            while not any(m == "close_writer" and k.get("release_owner") for m, k in host.calls):
                await asyncio.sleep(0.001)  # the slow turn is in its release
            await one("01OTHERTURN")
            other_done.set()

        await asyncio.wait_for(asyncio.gather(one("01SLOWRELEASE", release_owner="01OWNER"), other()), DEADLINE_S)

    guard = threading.Thread(target=watchdog, daemon=True)
    guard.start()
    asyncio.run(main())
    guard.join(DEADLINE_S)
    assert progressed == [True], "the other turn waited for the slow turn's release"
    assert read_lease(st, "01SLOWRELEASE").state == "released"
    assert [e["type"] for e in inspect(st, "01OTHERTURN").events][-1] == "turn/end"


def test_a_record_above_the_stores_limit_is_refused_at_append_and_the_writer_goes_on(tmp_path: Path) -> None:
    """As a local writer does: ``RECORD_TOO_LARGE`` from ``append`` itself, nothing sent, and the records
    after it (a turn's closing ``turn/end``) still land. The remote writer only queued it; the service
    refused the whole coalesced batch, the writer broke, and the turn's log was left open for good
    (a one-shot child listed ``crashed``), on Ray only."""
    st = Store(tmp_path / "store", durability="strict", max_record_bytes=4096)
    host = ServiceHost(st)
    try:
        assert host.run(host.service.ping)["max_record_bytes"] == 4096  # what a pool hands its workers
        epoch = leased(st, "s1")
        writer = ServiceSessions(host.call, max_record_bytes=4096).open_writer("s1", epoch=epoch)
        writer.append([("turn/start", {"message_id": "m"}), ("assistant/message", {"text": "before"})])
        with pytest.raises(RecordTooLargeError) as caught:
            writer.append([("assistant/message", {"text": "x" * 5000})])
        assert caught.value.code == "RECORD_TOO_LARGE"
        writer.append([("assistant/message", {"text": "after"}), ("turn/end", {"stop_reason": "completed", "diagnostic": None})], commit=True)
        asyncio.run(writer.flush())
        writer.close()
        assert [(e["type"], e["data"].get("text")) for e in inspect(st, "s1").events] == [
            ("turn/start", None), ("assistant/message", "before"), ("assistant/message", "after"), ("turn/end", None)]
    finally:
        host.close()


def test_a_writer_whose_service_stopped_answering_closes_without_waiting_on_it_again(st: Store, host: ServiceHost) -> None:
    """A batch whose call timed out (a hung store host) failed the turn after one timeout, then the
    writer's close asked the same service to close it and waited a second whole timeout (2 × 60 s on
    Ray). The close goes out in the background: the turn ends after one timeout."""
    epoch = leased(st, "s1")
    closing = threading.Event()
    hung = threading.Event()

    def call(method: str, **kwargs: Any) -> dict[str, Any]:
        if method == "append":
            raise TimeoutError("the store service did not answer")  # as Ray's GetTimeoutError, a transport failure
        if method == "close_writer":
            closing.set()
            assert hung.wait(DEADLINE_S)
        return host.call(method, **kwargs)

    writer = ServiceSessions(call).open_writer("s1", epoch=epoch)
    writer.append([("turn/start", {"message_id": "m"})], commit=True)
    with pytest.raises(StoreServiceError):
        asyncio.run(writer.flush())
    started = time.monotonic()
    writer.close()
    assert time.monotonic() - started < DEADLINE_S / 4
    assert closing.wait(DEADLINE_S)  # still asked, in the background, for a service that comes back
    hung.set()
    wait_for(lambda: not [t for t in threading.enumerate() if t.name == "store-writer-close-s1"], "the background close to end")
