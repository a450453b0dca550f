"""The outbox drainer: store, acknowledge and count every entry exactly once."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis

from config import Settings, reset_settings
from external_interface.storage.outbox import (
    Drainer,
    OutboxEntry,
    backlog,
    counters_key,
    dead_key,
    outbox_entry_fields,
    requeue_dead,
    stream_key,
    xadd_entry,
)
from external_interface.storage.outbox.drainer import MAX_IDLE_BLOCK
from external_interface.storage.outbox.entries import (
    LAST_WAVE,
    LAST_WAVE_GATHER,
    gather_window,
    tasks_done,
    tasks_left,
)
from external_interface.storage.sinks.base import PermanentSinkError, SinkError, entry_version
from external_interface.storage.sinks.jsonl import JsonlSink, iter_records, read_items, type_files
from utils import process

T = "demo.post"


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def counters(rds: redis.Redis, prefix: str, run: str) -> dict[str, int]:
    fields = cast("dict[bytes, bytes]", rds.hgetall(counters_key(prefix, run)))
    return {k.decode(): int(v) for k, v in fields.items()}


def add_posts(rds: redis.Redis, prefix: str, n: int, per_entry: int = 2, run: str = "r1") -> int:
    """n entries of `per_entry` posts each, unique post ids; -> items added."""
    for e in range(n):
        items = [{"post_id": e * per_entry + i, "likes": e} for i in range(per_entry)]
        xadd_entry(rds, prefix, T, ["post_id"], items, run=run, step="feed", task="demo.h5.feed")
    return n * per_entry


class FlakySink:
    """In-memory sink that can be switched down, or refuse items marked `bad`."""

    name = "flaky"

    def __init__(self) -> None:
        self.down = False
        self.writes: list[tuple[str, list[dict[str, Any]]]] = []

    def write(self, item_type, key_fields, items, *, origins=None) -> None:
        if self.down:
            raise SinkError("flaky is down", self.name)
        if any(i.get("bad") for i in items):
            raise PermanentSinkError("flaky refuses bad items", self.name)
        self.writes.append((item_type, items))

    def close(self) -> None:
        pass


@pytest.fixture
def jsonl(tmp_path: Path) -> JsonlSink:
    """Append mode: every write stays in the file, so a test sees an entry written twice."""
    return JsonlSink(tmp_path / "items", fsync=False, mode="append")


@pytest.fixture
def drainers() -> Iterator[list[Drainer]]:
    started: list[Drainer] = []
    yield started
    for d in started:
        d.stop(timeout=15)


def test_entry_fields_follow_the_contract() -> None:
    f = outbox_entry_fields("r1", "feed", "demo.h5.feed", T, ["post_id"], [{"post_id": 1}])
    assert f == {
        "run": "r1",
        "step": "feed",
        "task": "demo.h5.feed",
        "type": T,
        "key": b'["post_id"]',
        "items": b'[{"post_id":1}]',
    }
    assert orjson.loads(outbox_entry_fields("", "", "t", T, [], [], dedup={"k": 1})["dedup"]) == {
        "k": 1
    }
    e = OutboxEntry.parse(
        b"1-0", {k.encode(): v.encode() if isinstance(v, str) else v for k, v in f.items()}
    )
    assert (e.run, e.step, e.task, e.type, e.key_fields, e.items) == (
        "r1",
        "feed",
        "demo.h5.feed",
        T,
        ["post_id"],
        [{"post_id": 1}],
    )
    assert OutboxEntry.parse(b"1-0", {b"type": T.encode(), b"items": b"{oops"}).error


def test_drain_stores_acks_and_counts_once(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink
) -> None:
    n = add_posts(rds, key_prefix, 5)
    xadd_entry(
        rds, key_prefix, "demo.user", ["uid"], [{"uid": "u1"}], run="r1", step="user", task="t"
    )
    xadd_entry(rds, key_prefix, T, ["post_id"], [{"post_id": 999}])  # no run: stored, not counted
    seen: list[tuple[str, int]] = []
    d = Drainer(
        rds,
        key_prefix,
        [jsonl],
        batch=3,
        interval=0.1,
        hooks=[lambda t, items: seen.append((t, len(items)))],
    )
    assert d.drain_once() == 7
    assert len(read_items(T, jsonl.root)) == n + 1
    assert read_items("demo.user", jsonl.root) == [{"uid": "u1"}]
    assert counters(rds, key_prefix, "r1") == {"feed:stored": n, "stored": n + 1, "user:stored": 1}
    # a hash we create never lives forever: as long as the run records (RUN_RETENTION, 7 days)
    assert 6 * 86400 < rds.ttl(counters_key(key_prefix, "r1")) <= 7 * 86400
    assert rds.xlen(stream_key(key_prefix)) == 0  # acknowledged entries are deleted
    assert sum(c for t, c in seen if t == T) == n + 1  # hooks saw every stored item once
    assert [c for t, c in seen if t == "demo.user"] == [1]
    b = backlog(rds, Settings(key_prefix=key_prefix))  # the prefix or the settings
    assert (b["length"], b["pending"], b["undelivered"], b["errors"], b["dead"]) == (0, 0, 0, {}, 0)
    assert d.drain_once() == 0


def test_counters_the_drainer_creates_live_as_long_as_the_run_records(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAINCRAWL_RUN_RETENTION", "5000")
    reset_settings()
    try:
        xadd_entry(rds, key_prefix, T, ["post_id"], [{"post_id": 1}], run="r9", step="s", task="t")
        assert Drainer(rds, key_prefix, [jsonl], batch=3, interval=0.1).drain_once() == 1
        assert 4900 < rds.ttl(counters_key(key_prefix, "r9")) <= 5000
    finally:
        monkeypatch.undo()
        reset_settings()


def test_racing_drainers_count_each_entry_once(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink
) -> None:
    """A reads entries and stalls; B claims and stores them; A's late ack counts nothing."""
    n = add_posts(rds, key_prefix, 4)
    a = Drainer(rds, key_prefix, [jsonl], consumer="a", claim_idle=0.05)
    b = Drainer(rds, key_prefix, [jsonl], consumer="b", claim_idle=0.05)
    a.ensure_group()
    taken = a.read(100, None)
    assert len(taken) == 4
    time.sleep(0.1)
    claimed = b.claim(100)
    assert [e.id for e in claimed] == [e.id for e in taken]
    assert b.flush(claimed) == []
    assert a.flush(taken) == []  # wrote again (idempotent), XACK returned 0: no count
    assert counters(rds, key_prefix, "r1") == {"feed:stored": n, "stored": n}
    assert len(list(iter_records(T, jsonl.root))) == n  # and the file holds one copy
    assert (a.stats["stored"], b.stats["stored"]) == (4, 4)


def test_concurrent_drainer_threads(
    rds: redis.Redis, key_prefix: str, tmp_path: Path, drainers: list[Drainer]
) -> None:
    for i in range(3):
        sink = JsonlSink(tmp_path / "items", fsync=False, mode="append")
        d = Drainer(rds, key_prefix, [sink], batch=7, interval=0.05, claim_idle=0.2)
        d.start_thread(name=f"drainer-{i}")
        drainers.append(d)
    n = 0
    for _ in range(5):
        n += add_posts(rds, key_prefix, 30, per_entry=3)
        time.sleep(0.05)
    # post ids repeat across rounds: 150 entries, 90 distinct posts
    wait_until(lambda: counters(rds, key_prefix, "r1").get("stored") == n, 20, "all stored")
    time.sleep(0.3)
    assert counters(rds, key_prefix, "r1") == {"feed:stored": n, "stored": n}
    recs = list(iter_records(T, tmp_path / "items"))
    assert len(recs) == n and len({r["entry"] for r in recs}) == 150
    assert len(read_items(T, tmp_path / "items")) == 90
    assert rds.xlen(stream_key(key_prefix)) == 0


def test_sink_outage_keeps_everything_then_stores_once(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, drainers: list[Drainer]
) -> None:
    flaky = FlakySink()
    flaky.down = True
    d = Drainer(
        rds, key_prefix, [jsonl, flaky], batch=50, interval=0.05, backoff=0.05, max_backoff=0.2
    )
    # written before the drainer starts: its first read takes all 10 (a retrying drainer reads
    # nothing new, so entries written while it retries stay unread in the stream, not pending)
    n = add_posts(rds, key_prefix, 10)
    d.start_thread()
    drainers.append(d)
    b = wait_until(
        lambda: (x := backlog(rds, key_prefix))["errors"].get("flaky") and x, 10, "error"
    )
    assert "flaky is down" in b["errors"]["flaky"]["error"]
    time.sleep(0.3)  # several retries
    b = backlog(rds, key_prefix)
    assert b["length"] == 10 and b["pending"] == 10 and b["oldest_pending_age"] >= 0.2
    assert counters(rds, key_prefix, "r1") == {}
    assert "jsonl" not in b["errors"]
    flaky.down = False
    wait_until(lambda: counters(rds, key_prefix, "r1").get("stored") == n, 10, "stored")
    assert sum(len(items) for _, items in flaky.writes) == n  # all delivered, once
    assert len(list(iter_records(T, jsonl.root))) == n  # jsonl was retried too: still once
    wait_until(lambda: backlog(rds, key_prefix)["errors"] == {}, 5, "errors cleared")
    assert backlog(rds, key_prefix)["length"] == 0


def test_dead_drainer_entries_are_claimed(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, drainers: list[Drainer]
) -> None:
    n = add_posts(rds, key_prefix, 6)
    dead = Drainer(rds, key_prefix, [jsonl], consumer="dead-one")
    dead.ensure_group()
    assert len(dead.read(100, None)) == 6  # read, then "killed": never acknowledged
    assert backlog(rds, key_prefix)["consumers"] == {"dead-one": 6}
    d = Drainer(rds, key_prefix, [jsonl], interval=0.05, claim_idle=0.3)
    d.start_thread()
    drainers.append(d)
    wait_until(lambda: counters(rds, key_prefix, "r1").get("stored") == n, 10, "claimed and stored")
    assert d.stats["claimed"] == 6
    assert len(read_items(T, jsonl.root)) == n


def test_shutdown_flushes_the_last_partial_batch(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink
) -> None:
    d = Drainer(rds, key_prefix, [jsonl], batch=1000, interval=60.0, idle_flush=0)
    d.start_thread()
    n = add_posts(rds, key_prefix, 3)
    wait_until(lambda: backlog(rds, key_prefix)["pending"] == 3, 5, "read")
    assert counters(rds, key_prefix, "r1") == {}  # neither size nor time is due
    d.stop(timeout=10)
    assert counters(rds, key_prefix, "r1") == {"feed:stored": n, "stored": n}
    b = backlog(rds, key_prefix)
    assert (b["length"], b["pending"], b["consumers"]) == (0, 0, {})


def test_a_quiet_stream_flushes_a_partial_batch_at_once(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, drainers: list[Drainer]
) -> None:
    """A run's last items are stored as soon as no more come (`idle_flush`), not when the
    batch's flush interval ends: neither size (1000) nor time (60 s) is due here."""
    _three_stored_by(Drainer(rds, key_prefix, [jsonl], batch=1000, interval=60.0, idle_flush=0.05),
                     drainers, jsonl)  # fmt: skip
    assert backlog(rds, key_prefix)["pending"] == 0


def _three_stored_by(d: Drainer, drainers: list[Drainer], jsonl: JsonlSink) -> None:
    """Three posts of run r1 added with `d` running: all stored, before size or age is due."""
    d.start_thread()
    drainers.append(d)
    n = add_posts(d.r, d.prefix, 3)
    wait_until(lambda: counters(d.r, d.prefix, "r1").get("stored") == n, 10, "stored")
    assert len(read_items(T, jsonl.root)) == n


def test_a_partial_batch_whose_runs_have_no_task_left_is_stored_at_once(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, drainers: list[Drainer]
) -> None:
    """The run's last commit is done (`outstanding` 0): no more entries will come for it, so
    its items are stored at the read that brought them. Neither size (1000), age (60 s) nor
    quiet (`idle_flush` off) is due here: only the run's end flushes the batch."""
    rds.hset(counters_key(key_prefix, "r1"), "outstanding", 0)
    _three_stored_by(Drainer(rds, key_prefix, [jsonl], batch=1000, interval=60.0, idle_flush=0.0),
                     drainers, jsonl)  # fmt: skip


def test_tasks_done_asks_every_run_of_the_entries(rds: redis.Redis, key_prefix: str) -> None:
    """True only when every run read has `outstanding` at 0 or below; a run still working, a
    run without counters or a runless entry keeps the batch waiting as before."""
    rds.hset(counters_key(key_prefix, "a"), "outstanding", 0)
    rds.hset(counters_key(key_prefix, "b"), "outstanding", 2)

    def entries(*runs: str) -> list[OutboxEntry]:
        return [OutboxEntry(id=f"1-{i}", fields={}, run=r) for i, r in enumerate(runs)]

    assert tasks_done(rds, key_prefix, entries("a", "a"))
    assert not tasks_done(rds, key_prefix, entries("a", "b"))
    assert not tasks_done(rds, key_prefix, entries("a", "unknown"))
    assert not tasks_done(rds, key_prefix, entries("a", ""))
    assert not tasks_done(rds, key_prefix, [])
    assert tasks_left(rds, key_prefix, entries("a", "b")) == 2
    assert tasks_left(rds, key_prefix, entries("a", "unknown")) is None


def test_a_drainer_gathers_a_short_window_in_its_runs_last_wave() -> None:
    """The run may end in another process (whose commit wakes only its own drainer): while
    every run read has at most LAST_WAVE tasks left, the window is short; else `idle_flush`."""
    assert gather_window(None, 0.05) == 0.05
    assert gather_window(LAST_WAVE + 1, 0.05) == 0.05
    assert gather_window(LAST_WAVE, 0.05) == gather_window(0, 0.05) == LAST_WAVE_GATHER
    assert gather_window(1, LAST_WAVE_GATHER / 2) == LAST_WAVE_GATHER / 2


def record_blocks(d: Drainer) -> list[int | None]:
    """The block (ms) of each of the drainer's reads from now on, in order."""
    blocks: list[int | None] = []
    read = d.read

    def counted(count: int, block_ms: int | None) -> list[OutboxEntry]:
        blocks.append(block_ms)
        return read(count, block_ms)

    d.read = counted  # type: ignore[method-assign]
    return blocks


def test_entries_that_keep_coming_are_read_a_window_at_a_time(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, drainers: list[Drainer]
) -> None:
    """While entries come (the drainer holds some), the next ones gather for `idle_flush` and
    one non-blocking read takes them all: a read a window, not one an entry (a blocking read
    returns with the first entry). Every entry is stored (and counted once) once the stream is quiet."""
    d = Drainer(rds, key_prefix, [jsonl], batch=1000, interval=60.0, idle_flush=0.2)
    blocks = record_blocks(d)
    d.start_thread()
    drainers.append(d)
    wait_until(lambda: blocks, 10, "the first read")
    before = len(blocks)
    n = 0
    for e in range(100):  # one XADD every 5 ms or so, as commits come
        n += add_posts(rds, key_prefix, 1, run=f"r{e}")
        time.sleep(0.005)
    wait_until(
        lambda: sum(counters(rds, key_prefix, f"r{e}").get("stored", 0) for e in range(100)) == n,
        10,
        "stored",
    )
    reads = blocks[before:]
    assert None in reads  # a window's read does not block
    assert len(reads) <= 30, reads  # about 0.5 s of writes in 0.2 s windows, not 100 reads


def test_an_idle_drainer_blocks_longer_and_still_reads_a_new_entry_at_once(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, drainers: list[Drainer]
) -> None:
    """On an empty stream the drainer's blocking reads double up to `max_idle_block` (by
    default MAX_IDLE_BLOCK: an idle worker's drainer asks Redis every 20 s, not twice a
    second; 2 s here); an entry returns the blocked read at once, whatever the block."""
    d = Drainer(rds, key_prefix, [jsonl], batch=1000, interval=0.1, max_idle_block=2.0)
    blocks = record_blocks(d)
    d.start_thread()
    drainers.append(d)
    wait_until(lambda: blocks.count(2000) >= 2, 30, "two idle blocks")
    assert blocks[:3] == [500, 1000, 2000]  # from MAX_BLOCK, doubling, not at interval
    n = add_posts(rds, key_prefix, 2)  # while a 2 s block is under way: read and stored
    wait_until(lambda: counters(rds, key_prefix, "r1").get("stored") == n, 10, "stored")
    wait_until(lambda: blocks[-1] == 500, 10, "the short block back after entries came")


def test_a_stop_ends_an_idle_drainers_long_block_at_once(
    rds: redis.Redis, redis_url: str, key_prefix: str, jsonl: JsonlSink
) -> None:
    """An idle drainer blocks up to MAX_IDLE_BLOCK (20 s) in one XREADGROUP; a stop unblocks
    it (CLIENT UNBLOCK: answered as a timeout) rather than waiting it out, and an entry
    written just before the stop is stored, not left pending. (The client's socket timeout
    is the workers' 30 s: a block stays under two thirds of it.) Only this test's connections
    are looked at (by their client name): the test Redis is shared, and another test's drainer
    may be blocked on it at the same time."""
    assert MAX_IDLE_BLOCK >= 10
    name = f"stop-ends-block-{key_prefix}"
    client = redis.Redis.from_url(redis_url, socket_timeout=30, client_name=name)

    def blocked() -> list[dict[str, Any]]:
        return [
            c
            for c in rds.client_list()
            if c.get("name") == name and c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "")
        ]

    d = Drainer(client, key_prefix, [jsonl], batch=1000, interval=60.0, idle_flush=0)
    blocks = record_blocks(d)
    d.start_thread()
    wait_until(lambda: int(MAX_IDLE_BLOCK * 1000) in blocks, 60, "a long idle block")
    wait_until(blocked, 10, "blocked")
    started = time.monotonic()
    d.stop(timeout=30)
    assert time.monotonic() - started < 5  # not the block's 20 s
    assert not blocked()
    d = Drainer(client, key_prefix, [jsonl], batch=1000, interval=60.0, idle_flush=0)
    d.start_thread()
    wait_until(lambda: d.reader.unblockable, 10, "the reader's client id")
    n = add_posts(rds, key_prefix, 2)
    wait_until(lambda: backlog(rds, key_prefix)["pending"] == 2, 10, "read")
    d.stop(timeout=30)
    client.close()
    assert counters(rds, key_prefix, "r1") == {"feed:stored": n, "stored": n}


def test_an_idle_drainer_does_not_update_the_horizon_every_5_s(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, drainers: list[Drainer]
) -> None:
    """Nothing read, claimed or held since the last horizon update: the sink already has it
    (an older horizon is safe), so an idle drainer asks for it once a minute, not every 5 s;
    entries coming again update it again."""
    d = Drainer(rds, key_prefix, [jsonl], batch=1000, interval=0.05, max_idle_block=0.5)
    updates: list[float] = []
    update = d.update_horizon

    def counted(held: Any = ()) -> None:
        updates.append(time.monotonic())
        update(held)

    d.update_horizon = counted  # type: ignore[method-assign]
    d.start_thread()
    drainers.append(d)
    n = add_posts(rds, key_prefix, 2)
    wait_until(lambda: counters(rds, key_prefix, "r1").get("stored") == n, 10, "stored")
    wait_until(lambda: len(updates) >= 2, 15, "the update after the entries")
    settled = len(updates)
    time.sleep(12)  # two 5 s rounds with nothing read
    assert len(updates) == settled
    m = add_posts(rds, key_prefix, 1, run="r2")
    wait_until(lambda: counters(rds, key_prefix, "r2").get("stored") == m, 10, "stored again")
    wait_until(lambda: len(updates) > settled, 15, "an update after the new entries")


def test_an_idle_drainers_claims_back_off_and_come_back_with_work(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, drainers: list[Drainer]
) -> None:
    """Nothing read, stored or claimed and no task run in the process since the last claim:
    the wait to the next XAUTOCLAIM doubles from `claim_every` up to `claim_idle` (so a dead
    drainer's entries are still claimed within twice `claim_idle`); a task started in the
    process brings the next claim within `claim_every`."""
    d = Drainer(rds, key_prefix, [jsonl], interval=0.05, claim_idle=3.0, claim_every=0.5,
                max_idle_block=0.5)  # fmt: skip
    claims: list[float] = []
    claim = d.claim

    def counted(count: int) -> list[OutboxEntry]:
        claims.append(time.monotonic())
        return claim(count)

    d.claim = counted  # type: ignore[method-assign]
    d.start_thread()
    drainers.append(d)
    wait_until(lambda: len(claims) >= 5, 30, "five idle claims")
    gaps = [b - a for a, b in itertools.pairwise(claims)]
    assert gaps[2] >= 2.5 and gaps[3] >= 2.5  # 1, 2, then 3 (claim_idle) s, not 0.5
    assert gaps[3] < 6
    done = len(claims)
    process.note_work()  # a task starts in this process
    wait_until(lambda: len(claims) > done, 3, "a claim soon after the task")
    wait_until(lambda: len(claims) > done + 1, 5, "the next one at the short pace")
    assert claims[done + 1] - claims[done] < 2.5


def test_poison_entries_are_isolated_and_dead_lettered(rds: redis.Redis, key_prefix: str) -> None:
    flaky = FlakySink()
    add_posts(rds, key_prefix, 2)
    xadd_entry(
        rds,
        key_prefix,
        T,
        ["post_id"],
        [{"post_id": 50, "bad": True}, {"post_id": 51}],
        run="r1",
        step="feed",
    )
    add_posts(rds, key_prefix, 1, run="r2")
    rds.xadd(stream_key(key_prefix), {"type": T, "items": "{not json", "run": "r1", "step": "feed"})
    d = Drainer(rds, key_prefix, [flaky], batch=100)
    assert d.drain_once() == 5
    assert d.stats == {"stored": 3, "dead": 2, "failures": 0, "claimed": 0}
    assert counters(rds, key_prefix, "r1") == {
        "feed:stored": 4,
        "stored": 4,
        "feed:store_failed": 2,
        "store_failed": 2,
    }
    assert counters(rds, key_prefix, "r2") == {"feed:stored": 2, "stored": 2}
    dead = cast("list[tuple[bytes, dict[bytes, bytes]]]", rds.xrange(dead_key(key_prefix)))
    refused = [f for _, f in dead if b"refuses bad items" in f[b"error"]]
    malformed = [f for _, f in dead if f[b"error"].startswith(b"malformed")]
    assert len(dead) == 2 and len(refused) == len(malformed) == 1
    assert refused[0][b"sink"] == b"flaky" and orjson.loads(refused[0][b"items"])[0]["bad"] is True
    assert backlog(rds, key_prefix)["dead"] == 2
    # the receiver is fixed: requeue; the refused entry is stored, the malformed one dies again
    assert requeue_dead(rds, key_prefix) == 2
    assert counters(rds, key_prefix, "r1")["store_failed"] == 0
    assert rds.xlen(dead_key(key_prefix)) == 0
    accepting = FlakySink()
    accepting.write = lambda t, k, items, origins=None: accepting.writes.append((t, items))  # type: ignore[method-assign, misc]
    assert Drainer(rds, key_prefix, [accepting], batch=100).drain_once() == 2
    assert counters(rds, key_prefix, "r1") == {
        "feed:stored": 6,
        "stored": 6,
        "feed:store_failed": 0,
        "store_failed": 0,
    }
    assert rds.xlen(dead_key(key_prefix)) == 1


def test_failing_hook_is_retried(rds: redis.Redis, key_prefix: str, jsonl: JsonlSink) -> None:
    calls: list[int] = []

    def hook(item_type: str, items: list[dict[str, Any]]) -> None:
        calls.append(len(items))
        if len(calls) == 1:
            raise RuntimeError("dedup store down")

    n = add_posts(rds, key_prefix, 2)
    d = Drainer(rds, key_prefix, [jsonl], hooks=[hook])
    assert d.drain_once() == 0  # sinks confirmed, but the hook failed: not acknowledged
    assert backlog(rds, key_prefix)["errors"]["on_stored"]["error"].endswith("dedup store down")
    assert d.drain_once() == 2  # own pending entries, again
    assert calls == [n, n] and counters(rds, key_prefix, "r1")["stored"] == n
    assert len(list(iter_records(T, jsonl.root))) == n
    assert backlog(rds, key_prefix)["errors"] == {}


def test_horizon_reaches_the_jsonl_sink(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink
) -> None:
    add_posts(rds, key_prefix, 2)
    entries = cast(
        "list[tuple[bytes, dict[bytes, bytes]]]", rds.xrange(stream_key(key_prefix), count=1)
    )
    first = entries[0][0].decode()
    d = Drainer(rds, key_prefix, [jsonl])
    d.update_horizon()
    assert jsonl._horizon is not None
    assert jsonl._horizon == entry_version(first)
    d.drain_once()
    d.update_horizon()  # empty stream: everything up to the last id is gone
    assert jsonl._horizon >= entry_version(first)


def test_nine_runs_through_the_drainer_leave_one_copy(
    rds: redis.Redis, key_prefix: str, tmp_path: Path, drainers: list[Drainer]
) -> None:
    """The drainer settles its sinks when it holds nothing: the JSONL sink then compacts, so
    the file holds each post once however many runs stored it."""
    sink = JsonlSink(tmp_path / "items", fsync=False, compact_after=0.2)
    d = Drainer(rds, key_prefix, [sink], batch=50, interval=0.05)
    d.start_thread()
    drainers.append(d)
    n = 0
    for run in range(9):
        n += add_posts(rds, key_prefix, 10, per_entry=3, run=f"r{run}")
        wait_until(lambda: rds.xlen(stream_key(key_prefix)) == 0, 10, f"run {run} stored")
        time.sleep(0.1)
    assert sum(counters(rds, key_prefix, f"r{run}")["stored"] for run in range(9)) == n

    def lines() -> int:
        return sum(len(p.read_bytes().splitlines()) for p in type_files(T, sink.root))

    wait_until(lambda: lines() == 30, 10, "one line per post")
    assert read_items(T, sink.root, run="r8") == read_items(T, sink.root)
    assert [i["post_id"] for i in read_items(T, sink.root)] == list(range(30))


# --- an entry held twice after a Redis error -------------------------------------------------


def test_an_entry_passed_twice_is_written_once(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink
) -> None:
    n = add_posts(rds, key_prefix, 2)
    d = Drainer(rds, key_prefix, [jsonl], hooks=[])
    d.ensure_group()
    taken = d.read(100, None)
    assert d.flush([*taken, *taken, taken[0]]) == []
    recs = list(iter_records(T, jsonl.root))
    assert len(recs) == n and len({r["entry"] for r in recs}) == 2
    assert counters(rds, key_prefix, "r1") == {"feed:stored": n, "stored": n}


def test_entries_claimed_back_after_a_redis_error_are_held_once(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, drainers: list[Drainer]
) -> None:
    """During an outage even the heartbeat fails: the drainer's own XAUTOCLAIM hands back the
    entries it holds. They must not be appended to its buffer a second time."""
    seen = FlakySink()
    d = Drainer(rds, key_prefix, [jsonl, seen], batch=100, interval=1.0, claim_idle=0.2,
                claim_every=0.05, backoff=0.2, max_backoff=0.4, hooks=[])  # fmt: skip
    n = add_posts(rds, key_prefix, 3)
    real_read, calls = d.read, {"n": 0}

    def read_through_an_outage(count: int, block_ms: int | None) -> Any:
        calls["n"] += 1
        if 2 <= calls["n"] <= 5:
            raise redis.ConnectionError("Connection refused (simulated outage)")
        return real_read(count, block_ms)

    d.read = read_through_an_outage  # type: ignore[method-assign]
    d.heartbeat = lambda entries: None  # type: ignore[method-assign]  # XCLAIM fails too
    d.start_thread()
    drainers.append(d)
    wait_until(lambda: counters(rds, key_prefix, "r1").get("stored") == n, 20, "stored")
    assert d.stats["claimed"] >= 3  # it did claim its own entries back
    assert sum(len(items) for _, items in seen.writes) == n
    assert len(list(iter_records(T, jsonl.root))) == n


def test_a_refused_batch_is_retried_across_a_redis_error(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink, drainers: list[Drainer]
) -> None:
    flaky = FlakySink()
    flaky.down = True
    d = Drainer(rds, key_prefix, [jsonl, flaky], batch=50, interval=0.05, claim_idle=0.2,
                claim_every=0.05, backoff=0.05, max_backoff=0.2, hooks=[])  # fmt: skip
    real_flush, outage = d.flush, {"left": 0, "hit": 0}

    def flush_through_an_outage(entries: Any) -> Any:
        if outage["left"] > 0:
            outage["left"] -= 1
            outage["hit"] += 1
            raise redis.ConnectionError("Connection refused (simulated outage)")
        return real_flush(entries)

    d.flush = flush_through_an_outage  # type: ignore[method-assign]
    d.start_thread()
    drainers.append(d)
    n = add_posts(rds, key_prefix, 4)
    wait_until(lambda: d.stats["failures"] >= 1, 10, "the sink to refuse the batch")
    outage["left"] = 3
    wait_until(lambda: outage["hit"] == 3, 10, "the Redis errors")
    flaky.down = False
    wait_until(lambda: counters(rds, key_prefix, "r1").get("stored") == n, 10, "stored")
    assert sum(len(items) for _, items in flaky.writes) == n
    assert len(list(iter_records(T, jsonl.root))) == n
    assert backlog(rds, key_prefix)["length"] == 0


def test_an_entry_acked_before_a_lost_reply_is_not_written_again(
    rds: redis.Redis, key_prefix: str, jsonl: JsonlSink
) -> None:
    """Redis executes the ack script (XACK + XDEL) and goes away before the reply arrives:
    the drainer keeps its buffer and retries it. The sink must still know the entries as
    written although they left the stream: the horizon never passes an entry held."""
    n = add_posts(rds, key_prefix, 3)
    d = Drainer(rds, key_prefix, [jsonl], hooks=[])
    d.ensure_group()
    held = d.read(100, None)
    assert d.flush(held) == []  # stored, acknowledged, deleted: the reply is "lost"
    assert rds.xlen(stream_key(key_prefix)) == 0
    add_posts(rds, key_prefix, 1, run="r2")  # the stream moves on
    d.update_horizon(held)  # what the run loop does while it holds the buffer
    assert d.flush(held) == []  # the retry after the error
    assert len(list(iter_records(T, jsonl.root))) == n  # written once
    assert counters(rds, key_prefix, "r1") == {"feed:stored": n, "stored": n}  # counted once
    d.update_horizon()  # nothing held: the horizon moves past them, as before
    assert jsonl._horizon is not None and jsonl._horizon > max(entry_version(e.id) for e in held)


def test_a_run_s_last_commit_in_the_process_ends_the_drainer_s_gathering_at_once(
    rds: redis.Redis,
    key_prefix: str,
    jsonl: JsonlSink,
    drainers: list[Drainer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a drainer holds entries it gathers the next ones for a window; a commit of this
    process that leaves its run no task (`process.note_tasks_done`, lifecycle/commits.py)
    ends the window, and the run's items are stored then. The window is a minute here (size,
    age and quiet all far off): only the note can store the items in time."""
    from external_interface.storage.outbox import drainer as drainer_mod

    monkeypatch.setattr(drainer_mod, "MAX_BLOCK", 60.0)
    process.gather(0.0)  # no note left by an earlier drainer's stop
    rds.hset(counters_key(key_prefix, "r1"), "outstanding", LAST_WAVE + 1)  # a long window
    d = Drainer(rds, key_prefix, [jsonl], batch=1000, interval=120.0, idle_flush=60.0)
    d.start_thread()
    drainers.append(d)
    n = add_posts(rds, key_prefix, 1)
    wait_until(lambda: backlog(rds, key_prefix)["pending"] == 1, 10, "the first entry held")
    n += add_posts(rds, key_prefix, 1)  # the run's last page: its commit, then the note
    rds.hset(counters_key(key_prefix, "r1"), "outstanding", 0)
    process.note_tasks_done()
    wait_until(lambda: counters(rds, key_prefix, "r1").get("stored") == n, 10, "stored")
