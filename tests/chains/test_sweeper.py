"""The run ledger and its sweeper: which messages count as lost, against a private Redis
holding real kombu messages (published by a Celery app, as workers publish them)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import orjson
import pytest
import redis
from celery import Celery
from celery.worker.request import Request

from base_task import queue_for
from chains.sweeper import BATCH_TASK, Sweeper, broker_task_ids, message_ids
from config import Settings
from ledger.publish import send_kid
from ledger.state import Kid, RunState, stalled_resends
from tests.conditions import wait_for
from utils import process


@pytest.fixture
def settings(redis_url: str, key_prefix: str) -> Settings:
    return Settings(redis_url=redis_url, broker_url=redis_url, key_prefix=key_prefix)


@pytest.fixture
def app(settings: Settings) -> Iterator[Celery]:
    """A producer like the workers' (worker.configure): same key prefix, priorities, separator."""
    a = Celery("sweeper-test", set_as_current=False)
    a.conf.update(
        broker_url=settings.broker_url,
        task_serializer="json",
        broker_transport_options={
            "priority_steps": list(range(10)),
            "sep": ":",
            "queue_order_strategy": "priority",
            "global_keyprefix": f"{settings.key_prefix}:q:",
        },
    )
    try:
        yield a
    finally:
        a.close()


def queued(rds: redis.Redis, prefix: str) -> list[bytes]:
    return [
        m
        for k in rds.scan_iter(match=f"{prefix}:q:*", _type="list")
        for m in cast("list[bytes]", rds.lrange(k, 0, -1))
    ]


def deliver(rds: redis.Redis, prefix: str, tid: str) -> None:
    """What kombu does when a worker takes a message: pop it, then record it in `unacked`."""
    for k in rds.scan_iter(match=f"{prefix}:q:*", _type="list"):
        for raw in rds.lrange(k, 0, -1):
            if tid in message_ids(raw):
                rds.lrem(k, 1, raw)  # type: ignore[arg-type]  # bytes: redis-py's hint says str
                rds.hset(
                    f"{prefix}:q:unacked", uuid.uuid4().hex, json.dumps([json.loads(raw), "", "x"])
                )
                return
    raise AssertionError(f"{tid} not queued")


def pop_and_lose(rds: redis.Redis, prefix: str, tid: str) -> None:
    """Lost: popped by a worker killed before it recorded the message in `unacked`."""
    deliver(rds, prefix, tid)
    for tag, raw in rds.hgetall(f"{prefix}:q:unacked").items():
        if tid in message_ids(raw):
            rds.hdel(f"{prefix}:q:unacked", tag)


# --- reading task ids out of raw broker messages -------------------------------------------------


def test_message_ids_reads_plain_and_batch_messages_in_queues_and_unacked(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    p = settings.key_prefix
    plain = uuid.uuid4().hex
    send_kid(
        app, {"id": plain, "task": "demo.h5.feed", "params": {}, "meta": {"prio": 7}}, queue_for
    )
    entries: list[dict[str, Any]] = [
        {"id": uuid.uuid4().hex, "task": "demo.h5.user_info", "params": {"user_id": f"u{i}"},
         "meta": {"run": "r", "step": "s"}}
        for i in range(3)
    ]  # fmt: skip
    batch = uuid.uuid4().hex
    app.send_task(BATCH_TASK, args=[entries], task_id=batch, queue="demo", priority=2)
    raws = queued(rds, p)
    assert len(raws) == 2
    found = sorted(i for raw in raws for i in message_ids(raw))
    assert found == sorted([plain, batch, *(e["id"] for e in entries)])
    # the priority sub-queues (`demo:2`, `demo:7` with this separator) are read too
    assert broker_task_ids(rds, f"{p}:q:") == set(found)
    deliver(rds, p, batch)
    assert broker_task_ids(rds, f"{p}:q:") == set(found)  # now in `unacked`
    (value,) = rds.hvals(f"{p}:q:unacked")
    assert sorted(message_ids(value)) == sorted([batch, *(e["id"] for e in entries)])


@pytest.mark.parametrize(
    "raw",
    [b"\x00\xffnot json", b"[1, 2]", b"{}", b'{"headers": {"task": "chaincrawl.batch"}, "body": "!!"}',
     b"null", 42],
)  # fmt: skip
def test_message_ids_of_garbage_is_empty(raw: Any) -> None:
    assert message_ids(raw) == []


# --- the ledger --------------------------------------------------------------------------------------


def start_run(state: RunState, app: Celery, rid: str, n: int = 1) -> list[str]:
    """What chains.run does: record the run, queue the seeds, send what the cap lets through."""
    state.create_run(rid, "c", b"{}", 5, cap=0)
    msgs = [
        orjson.dumps({"id": uuid.uuid4().hex, "task": "demo.h5.feed", "params": {"page": i},
                      "meta": {"run": rid, "step": "root", "prio": 5}})
        for i in range(n)
    ]  # fmt: skip
    staging = state.kids_key(rid, "client")
    state.enqueue_and_release(rid, "root", msgs, staging)
    for raw in state.r.lrange(staging, 0, -1):
        send_kid(app, orjson.loads(raw), queue_for)
    state.r.delete(staging)
    return [orjson.loads(m)["id"] for m in msgs]


def commit(state: RunState, rid: str, tid: str, n_kids: int = 0, send: Any = None) -> list[str]:
    kids = [
        Kid("child", "demo.h5.user_info", {"user_id": f"u{i}"}, {"run": rid, "step": "child"},
            uuid.uuid4().hex)
        for i in range(n_kids)
    ]  # fmt: skip
    state.commit(rid=rid, tid=tid, step="root" if n_kids else "child", outcome="succeeded",
                 n_items=0, entries=(), kids=kids)  # fmt: skip
    if send is not None:  # the task sends its staged children (lifecycle/commits.py: Committer)
        for kid in state.staged_kids(rid, tid):
            send(kid)
        state.clear_kids(rid, tid)
    return [k.task_id for k in kids]


def test_ledger_holds_exactly_the_tasks_sent_and_not_committed(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    (seed,) = start_run(state, app, rid)
    assert set(state.ledger(rid)) == {seed}
    assert orjson.loads(state.ledger(rid)[seed])["params"] == {"page": 0}
    kids = commit(state, rid, seed, n_kids=3, send=lambda k: send_kid(app, k, queue_for))
    assert set(state.ledger(rid)) == set(kids)
    assert orjson.loads(state.ledger(rid)[kids[0]])["task"] == "demo.h5.user_info"
    assert rds.hget(state.run_key(rid), "last") is not None
    for k in kids[:2]:
        commit(state, rid, k)
    assert set(state.ledger(rid)) == {kids[2]}
    commit(state, rid, kids[2])
    assert state.info(rid)["status"] == "done"
    assert not rds.exists(state.ledger_key(rid))  # deleted with the run's completion


def test_children_waiting_behind_the_cap_are_in_the_ledger(
    rds: redis.Redis, settings: Settings
) -> None:
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    state.create_run(rid, "c", b"{}", 5, cap=1)
    seed = uuid.uuid4().hex
    state.enqueue_and_release(
        rid, "root",
        [orjson.dumps({"id": seed, "task": "t", "params": {}, "meta": {"run": rid}})],
        state.kids_key(rid, "x"),
    )  # fmt: skip
    kids = commit(state, rid, seed, n_kids=4)
    assert set(state.ledger(rid)) == set(kids)
    assert state.waiting(rid) == 3  # one released (staged), three held back


# --- the sweeper's decision ------------------------------------------------------------------------


def sweeper(rds: redis.Redis, settings: Settings, sent: list[dict[str, Any]], **kw: Any) -> Sweeper:
    return Sweeper(rds, rds, f"{settings.key_prefix}:q:", sent.append, settings,
                   interval=kw.pop("interval", 1), stall=kw.pop("stall", 30),
                   confirm=kw.pop("confirm", 0), **kw)  # fmt: skip


def stall(state: RunState, rid: str, seconds: float = 60) -> None:
    """As if the run's last commit were `seconds` ago."""
    import time

    state.r.hset(state.run_key(rid), "last", f"{time.time() - seconds:.3f}")


def test_sweeper_resends_only_what_is_nowhere_and_uncommitted_in_a_stalled_run(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    p = settings.key_prefix
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    (seed,) = start_run(state, app, rid)
    deliver(rds, p, seed)
    # the seed commits two children; its worker dies before sending them: they stay staged in
    # the run's `staged` hash, and the seed's message is lost too (only its redelivery would
    # send them)
    stranded = commit(state, rid, seed, n_kids=2)
    for tag, raw in rds.hgetall(f"{p}:q:unacked").items():
        if seed in message_ids(raw):
            rds.hdel(f"{p}:q:unacked", tag)
    (parent,) = start_run_more(state, app, rid)
    deliver(rds, p, parent)
    queued_kid, running_kid, lost_kid, done_kid = commit(
        state, rid, parent, n_kids=4, send=lambda k: send_kid(app, k, queue_for)
    )
    deliver(rds, p, running_kid)  # a worker runs it: in `unacked`
    pop_and_lose(rds, p, lost_kid)  # popped and lost with its worker
    pop_and_lose(rds, p, done_kid)  # gone from the broker too, but it did commit (its
    rds.sadd(state.done_key(rid, ""), done_kid)  # ledger entry left behind on purpose)
    sent: list[dict[str, Any]] = []
    sw = sweeper(rds, settings, sent)
    assert sw.sweep_once() == 0, "a run that is making progress is left alone"
    assert sent == []
    stall(state, rid)
    assert sw.sweep_once() == 3
    assert sorted(k["id"] for k in sent) == sorted([lost_kid, *stranded])
    lost_msg = next(k for k in sent if k["id"] == lost_kid)
    assert lost_msg["task"] == "demo.h5.user_info" and lost_msg["meta"]["run"] == rid
    assert list(lost_msg) == ["id", "task", "params", "meta"]  # TaskEnvelope's dict form
    assert done_kid not in state.ledger(rid)  # a committed entry is dropped, not re-sent
    c = state.counters(rid)
    assert c["resent"] == 3 and c["child:resent"] == 3
    assert stalled_resends(state.info(rid)) == 3  # since its last commit: `status` names it
    assert queued_kid in state.ledger(rid) and running_kid in state.ledger(rid)
    commit(state, rid, queued_kid)  # progress: the re-sends no longer count against it
    assert stalled_resends(state.info(rid)) == 0


def start_run_more(state: RunState, app: Celery, rid: str) -> list[str]:
    """One more root task of an existing run (as a replay adds one)."""
    msg = orjson.dumps({"id": uuid.uuid4().hex, "task": "demo.h5.feed", "params": {"page": 9},
                        "meta": {"run": rid, "step": "root"}})  # fmt: skip
    state.ledger_add(rid, [msg])
    send_kid(app, orjson.loads(msg), queue_for)
    return [orjson.loads(msg)["id"]]


def test_sweeper_leaves_staged_children_of_a_task_that_will_be_redelivered(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    p = settings.key_prefix
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    (seed,) = start_run(state, app, rid)
    deliver(rds, p, seed)
    commit(state, rid, seed, n_kids=2)  # died before sending; its message is still in unacked
    stall(state, rid)
    sent: list[dict[str, Any]] = []
    assert sweeper(rds, settings, sent).sweep_once() == 0
    assert sent == []


def test_sweeper_leaves_children_waiting_behind_the_cap(
    rds: redis.Redis, settings: Settings
) -> None:
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    state.create_run(rid, "c", b"{}", 5, cap=1)
    seed = uuid.uuid4().hex
    state.ledger_add(rid, [orjson.dumps({"id": seed, "task": "t", "params": {}, "meta": {}})])
    rds.rpush(
        state.pending_key(rid), orjson.dumps({"id": "w1", "task": "t", "params": {}, "meta": {}})
    )
    state.ledger_add(rid, [orjson.dumps({"id": "w1", "task": "t", "params": {}, "meta": {}})])
    stall(state, rid)
    sent: list[dict[str, Any]] = []
    assert sweeper(rds, settings, sent).sweep_once() == 1
    assert [k["id"] for k in sent] == [seed]  # the waiting one is released by the seed's commit


def test_a_second_look_spares_a_message_that_moved_meanwhile(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    """A message between BRPOP and `unacked` on a live worker is nowhere for a moment: only an
    entry missing at both looks, `confirm` apart, is re-sent."""
    p = settings.key_prefix
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    start_run(state, app, rid)
    stall(state, rid)
    raw = queued(rds, p)[0]
    rds.delete(*rds.scan_iter(match=f"{p}:q:*", _type="list"))  # popped ...
    sent: list[dict[str, Any]] = []
    sw = sweeper(rds, settings, sent)
    real = sw._present
    looks = {"n": 0}

    def present(rids: Any) -> set[str]:
        looks["n"] += 1
        if looks["n"] == 2:  # ... and recorded in unacked before the second look
            rds.hset(f"{p}:q:unacked", "tag", json.dumps([json.loads(raw), "", "x"]))
        return real(rids)

    sw._present = present  # type: ignore[method-assign]
    assert sw.sweep_once() == 0 and sent == [] and looks["n"] == 2


def test_one_sweeper_per_interval_and_none_on_amqp(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    start_run(state, app, rid)
    rds.delete(*rds.scan_iter(match=f"{settings.key_prefix}:q:*", _type="list"))  # lost
    stall(state, rid)
    a: list[dict[str, Any]] = []
    b: list[dict[str, Any]] = []
    assert sweeper(rds, settings, a, stall=5).try_sweep() == 1
    assert sweeper(rds, settings, b, stall=5).try_sweep() == 0  # the lock is taken
    assert len(a) == 1 and b == []
    amqp = settings.model_copy(update={"broker_url": "amqp://127.0.0.1:1//"})
    assert Sweeper.for_app(app, amqp) is None


def test_a_message_stuck_in_unacked_past_twice_the_visibility_timeout_counts_as_lost(
    rds: redis.Redis,
) -> None:
    """kombu restores an unacknowledged message after the visibility timeout; one still in
    `unacked` long after it (its restore sweeps are not running) is not counted as present,
    so the sweeper re-sends it."""
    p = f"stuck{uuid.uuid4().hex[:6]}"
    rds.hset(f"{p}:q:unacked", "tag-old", json.dumps([{"headers": {"id": "old"}}, "", "x"]))
    rds.hset(f"{p}:q:unacked", "tag-new", json.dumps([{"headers": {"id": "new"}}, "", "x"]))
    now = time.time()
    rds.zadd(f"{p}:q:unacked_index", {"tag-old": now - 100, "tag-new": now - 1})
    assert broker_task_ids(rds, f"{p}:q:") == {"old", "new"}
    assert broker_task_ids(rds, f"{p}:q:", stale_after=50) == {"new"}


# --- after a death or a broker restart: every run at once -----------------------------------------


def test_a_dead_worker_has_every_run_checked_at_once_not_after_the_stall(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    """A worker killed between kombu's BRPOP and its bookkeeping holds nothing in `unacked`;
    the `owners` set still shows it died, and the ledgers are checked then, not `stall` (here
    600 s) after the run's last commit."""
    from broker import owners

    p = settings.key_prefix
    bp = f"{p}:q:"
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    lost, queued_seed = start_run(state, app, rid, n=2)
    pop_and_lose(rds, p, lost)
    rds.sadd(f"{bp}{owners.OWNERS}", "alive-one")
    rds.set(f"{bp}{owners.ALIVE}alive-one", "1", ex=60)
    sent: list[dict[str, Any]] = []
    s = settings.model_copy(update={"dead_worker_after": 0.001})
    sw = Sweeper(rds, rds, bp, sent.append, s, interval=1, stall=600, confirm=0,
                 restore=lambda tags: 0)  # fmt: skip
    assert sw.restore_dead_owners() == 0 and sw.check_all == ""
    assert sw.sweep_once() == 0, "no death, no stall: nothing is checked"

    rds.sadd(f"{bp}{owners.OWNERS}", "killed-one")  # registered, heartbeat gone
    while owners.serving_for(rds) < 0.01:  # the restart guard: seen serving long enough
        time.sleep(0.01)
    assert sw.restore_dead_owners() == 0
    assert sw.check_all == "a worker died"
    assert owners.registered(rds, bp) == {"alive-one"}  # the dead one is forgotten
    assert sw.sweep_once() == 1
    assert [k["id"] for k in sent] == [lost]  # the queued seed is left alone
    assert state.counters(rid)["resent"] == 1
    assert sw.check_all == ""
    assert sw.sweep_once() == 1 - 1, "one pass per death, then the stall rule again"
    assert queued_seed in state.ledger(rid)


def test_a_broker_restart_has_every_run_checked_at_once(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    """A popped message whose reply a restart cut off is lost the same way; the broker's
    run_id, kept in Redis for whichever process sweeps next, tells of the restart."""
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    (lost,) = start_run(state, app, rid)
    pop_and_lose(rds, settings.key_prefix, lost)
    sent: list[dict[str, Any]] = []
    first = sweeper(rds, settings, sent, stall=600)
    assert first.note_broker_restart() is False  # nothing seen before: no restart
    assert first.sweep_once() == 0
    assert sweeper(rds, settings, sent, stall=600).note_broker_restart() is False  # same id
    # as if the last pass had seen a broker whose run_id is not today's
    rds.set(settings.key("sweeper", "broker_run_id"), "the-run-id-before-the-restart")
    later = sweeper(rds, settings, sent, stall=600)  # another worker process, same broker
    assert later.note_broker_restart() is True
    assert later.note_broker_restart() is False  # noticed once
    assert later.check_all == "the broker restarted"
    assert later.sweep_once() == 1 and [k["id"] for k in sent] == [lost]


def test_a_stalled_run_found_whole_is_looked_at_again_later_and_later(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    """A run stalled on purpose (its tasks waiting out a rate limit) is not read against the
    whole broker every interval: found whole, it waits `stall` seconds, then twice as long
    each time, until it commits again or a worker dies."""
    from chains.sweeper import CLEAN_MAX

    p = settings.key_prefix
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    (seed,) = start_run(state, app, rid)
    stall(state, rid)
    sent: list[dict[str, Any]] = []
    sw = sweeper(rds, settings, sent, stall=30)
    assert sw.sweep_once() == 0  # queued: whole
    mark = cast("bytes | None", rds.get(sw.clean_key(rid)))
    assert mark is not None and mark.split(b"|")[2] == b"30"
    pop_and_lose(rds, p, seed)
    assert sw.sweep_once() == 0 and sent == [], "in its back-off: not read again yet"
    assert sw.runs_to_check() == []

    stamp, _, wait = cast(bytes, rds.get(sw.clean_key(rid))).split(b"|")
    rds.set(sw.clean_key(rid), b"|".join([stamp, b"0", wait]))  # as if 30 s had passed
    sw.mark_clean([rid])  # a second clean look would double the wait...
    assert cast(bytes, rds.get(sw.clean_key(rid))).split(b"|")[2] == b"60"
    for _ in range(10):
        sw.mark_clean([rid])
    capped = cast(bytes, rds.get(sw.clean_key(rid)))
    assert float(capped.split(b"|")[2]) == CLEAN_MAX  # ...up to a cap

    sw.check_all = "a worker died"  # a death checks it at once, back-off or not
    assert sw.sweep_once() == 1 and [k["id"] for k in sent] == [seed]
    # a commit since the mark (a new `last`) ends the back-off too
    rid2 = uuid.uuid4().hex[:8]
    (seed2,) = start_run(state, app, rid2)
    stall(state, rid2)
    assert sw.sweep_once() == 0
    pop_and_lose(rds, p, seed2)
    stall(state, rid2, seconds=45)  # as a commit 45 s ago, after the mark's
    assert sw.sweep_once() == 1 and sent[-1]["id"] == seed2


def test_a_paused_run_is_not_stalled_and_its_parked_tasks_are_not_lost(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    """A paused run makes no commits on purpose: the stall rule leaves it alone. After a
    death every run is checked, and a task parked in its waiting list is found there; one
    that the broker lost is re-sent. Resume starts the stall clock again."""
    p = settings.key_prefix
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    parked, lost = start_run(state, app, rid, n=2)
    state.pause(rid)
    deliver(rds, p, parked)  # a worker takes it, finds the run paused and parks it
    raw = state.ledger(rid)[parked]
    assert state.park(rid, parked, raw, 0, counted=False) == 1
    for tag, m in rds.hgetall(f"{p}:q:unacked").items():  # ... and acks its message
        if parked in message_ids(m):
            rds.hdel(f"{p}:q:unacked", tag)
    pop_and_lose(rds, p, lost)
    stall(state, rid, 3600)
    sent: list[dict[str, Any]] = []
    sw = sweeper(rds, settings, sent)
    assert sw.stalled_runs() == [] and sw.sweep_once() == 0
    sw.check_all = "a worker died"
    assert sw.sweep_once() == 1
    assert [k["id"] for k in sent] == [lost]
    state.resume(rid, state.kids_key(rid, "client-resume"))
    assert sw.stalled_runs() == [], "resume restarted the stall clock"


# --- the sweep lock through a long pass -----------------------------------------------------------


def lost_seed(rds: redis.Redis, settings: Settings, app: Celery) -> str:
    """A stalled run whose seed the broker lost; -> the seed's id."""
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    (seed,) = start_run(state, app, rid)
    pop_and_lose(rds, settings.key_prefix, seed)
    stall(state, rid)
    return seed


def slow_pass(
    rds: redis.Redis, settings: Settings, app: Celery, monkeypatch: Any, count: int = 10_000
) -> str:
    """A stalled run whose seed the broker lost, behind `count` other messages that take
    0.25 ms each to read: a pass of about 2.5 s (10,000) against a sweep lock of 1 s."""
    import chains.broker_scan as scan_mod

    p = settings.key_prefix
    seed = lost_seed(rds, settings, app)
    filler = [orjson.dumps({"headers": {"id": f"f{i}", "task": "t"}}) for i in range(count)]
    rds.lpush(f"{p}:q:filler", *filler)
    read = scan_mod.message_ids

    def slow(raw: Any) -> list[str]:
        time.sleep(0.00025)
        return read(raw)

    monkeypatch.setattr(scan_mod, "message_ids", slow)
    return seed


def test_the_sweep_lock_is_kept_through_a_pass_longer_than_its_ttl(
    app: Celery, rds: redis.Redis, settings: Settings, monkeypatch: Any
) -> None:
    """Another worker's sweeper must not start a pass over a long one (both would re-send
    the same lost messages): the lock is extended as the broker is read, and left to expire
    one interval after the pass. Without the extension it expired 4 s into the pass. (A lock
    of seconds: on a busy machine a thread may wait a second for the CPU between extensions.)"""
    import threading

    seed = slow_pass(rds, settings, app, monkeypatch, count=40_000)  # a pass of 10 s or more
    sent: list[dict[str, Any]] = []
    a = sweeper(rds, settings, sent, interval=4.0)
    assert a.lock_ttl == 4.0
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(a.try_sweep()))
    t0 = time.monotonic()
    t.start()
    while a._lock is None and t.is_alive():  # a holds the lock: the others start now
        time.sleep(0.001)
    others: list[int] = []
    while t.is_alive():
        b = sweeper(rds, settings, sent, interval=4.0)
        others.append(b.try_sweep())
        time.sleep(0.05)
    took = time.monotonic() - t0
    assert took > 2.0 * a.lock_ttl, took
    assert out == [1] and [k["id"] for k in sent] == [seed]
    assert set(others) == {0} and len(others) > 20
    assert 0 < rds.pttl(a.lock_key) <= 4000  # the next pass: an interval after this one


def test_a_pass_that_lost_its_lock_stops_without_re_sending(
    app: Celery, rds: redis.Redis, settings: Settings, monkeypatch: Any
) -> None:
    import threading

    slow_pass(rds, settings, app, monkeypatch)
    sent: list[dict[str, Any]] = []
    a = sweeper(rds, settings, sent, interval=0.5)
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(a.try_sweep()))
    t.start()
    while a._lock is None and t.is_alive():
        time.sleep(0.001)
    time.sleep(0.3)
    rds.set(a.lock_key, "another-worker", px=5000)  # as if ours had expired and been taken
    t.join(10)
    assert out == [0] and sent == []
    assert rds.get(a.lock_key) == b"another-worker"


def test_the_second_look_s_wait_keeps_the_lock(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    """The pass waits `confirm` (1.5 s here) between its two looks, longer than the lock's
    1 s: the lock is kept through the wait and the lost seed is re-sent (the first version
    lost the lock there and stopped every such pass in the integration tests)."""
    seed = lost_seed(rds, settings, app)
    sent: list[dict[str, Any]] = []
    a = sweeper(rds, settings, sent, interval=0.5, confirm=1.5)
    assert a.try_sweep() == 1 and [k["id"] for k in sent] == [seed]
    rds.delete(a.lock_key)
    a._lock = (uuid.uuid4().hex, 0.0)  # mid-pass, its lock expired and nobody took it:
    a.keep_lock()  # taken again
    assert rds.get(a.lock_key) == a._lock[0].encode()


def test_a_connection_drop_in_one_process_has_the_next_sweeper_check_every_run(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    """broker/drops.py: a drop noted in one process reaches the sweeper of whichever
    process holds the lock next, whose pass checks every run (the seed's run is 60 s quiet,
    far from the 600 s stall)."""
    from broker import drops

    seed = lost_seed(rds, settings, app)
    sent: list[dict[str, Any]] = []
    dropped = sweeper(rds, settings, sent, stall=600)
    sweeping = sweeper(rds, settings, sent, stall=600)
    assert sweeping.try_sweep() == 0, "no stall, no death: nothing is checked"
    rds.delete(sweeping.lock_key)
    drops.take()
    drops.note("host: the broker connection dropped (ConnectionError)")
    dropped.note_connection_drops()  # its sweeper thread, each interval
    assert drops.take() == []
    assert sweeping.try_sweep() == 1 and [k["id"] for k in sent] == [seed]
    assert rds.get(sweeping.check_key) is None and sweeping.check_all == ""


def test_a_task_a_worker_refused_as_unknown_is_never_re_sent(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    from broker.workers import TaskSets

    p = settings.key_prefix
    state = RunState(rds, settings)
    rid = uuid.uuid4().hex[:8]
    refused, lost = start_run(state, app, rid, n=2)
    pop_and_lose(rds, p, refused)  # Celery's consumer dropped it: "unregistered task"
    pop_and_lose(rds, p, lost)
    TaskSets(rds, settings).mark_unknown([refused])
    stall(state, rid)
    sent: list[dict[str, Any]] = []
    assert sweeper(rds, settings, sent).sweep_once() == 1
    assert [k["id"] for k in sent] == [lost]


def test_messages_taken_before_a_connection_drop_are_given_back(
    rds: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's reject (or ack) that failed while the broker's Redis was down leaves the
    message in `unacked` under a live owner: the worker's own sweeper gives back what it took
    before the drop, two intervals later; what it took after stays."""
    from broker import drops, owners

    prefix = f"{settings.key_prefix}:q:"
    monkeypatch.setattr(owners, "_owner", "host:1:abc")
    for tag, taken in (("old", 1000.0), ("new", 3000.0)):
        rds.hset(f"{prefix}{owners.OWNER_HASH}", tag, "host:1:abc")
        rds.zadd(f"{prefix}unacked_index", {tag: taken})
    rds.hset(f"{prefix}{owners.OWNER_HASH}", "other", "host:2:def")
    rds.zadd(f"{prefix}unacked_index", {"other": 1000.0})
    restored: list[list[str]] = []

    def restore(tags: list[str]) -> int:
        restored.append(tags)
        return 1

    sw = sweeper(rds, settings, [], interval=5, restore=restore)
    drops.note("host: the broker connection dropped (ConnectionError)", at=2000.0)
    assert sw.restore_held_before_drop(now=2005.0) == 0  # too soon: running tasks may ack
    assert sw.restore_held_before_drop(now=2011.0) == 1 and restored == [["old"]]
    assert sw.restore_held_before_drop(now=2100.0) == 0  # once per drop
    drops.take()


def test_a_sweep_compacts_a_finished_stored_run_the_drainer_left(
    rds: redis.Redis, settings: Settings
) -> None:
    """A drainer run on its own has no hook to compact the runs it finishes storing: the
    sweep compacts them (and leaves running or unstored ones alone)."""
    state = RunState(rds, settings)
    for rid in ("done", "unstored", "running"):
        state.create_run(rid, "c", b'{"root": {"id": "s", "task": "t.x"}}', 5)
        rds.sadd(state.done_key(rid, ""), "t1")
        rds.hset(state.counters_key(rid), mapping={"items": 2, "stored": 2})
    rds.hset(state.run_key("done"), "status", "done")
    rds.hset(state.run_key("unstored"), "status", "done")
    rds.hset(state.counters_key("unstored"), "stored", 1)
    sw = sweeper(rds, settings, [])
    assert sw.compact_finished() == ["done"]
    assert not rds.exists(state.done_key("done", ""))
    assert rds.exists(state.done_key("unstored", ""), state.done_key("running", "")) == 2
    sw.sweep_once()
    assert sw.compact_finished() == []


def test_an_idle_fleets_sweeper_backs_off_and_comes_back_with_work(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    """With no active run and nothing unacknowledged a pass has nothing to protect: each one
    that finds nothing doubles the wait, up to `idle_max` (SWEEP_IDLE_MAX, 60 s; 1.6 s here).
    A task run in this process (`utils.process.note_work`) brings the base interval back at once, and a pass
    that finds an active run keeps it there."""
    from chains.sweeper import SWEEP_IDLE_MAX

    assert SWEEP_IDLE_MAX == 60
    sent: list[dict[str, Any]] = []
    sw = sweeper(rds, settings, sent, interval=0.2)
    sw.idle_max = 1.6
    waits: list[float] = []
    decide = sw.next_wait

    def spied() -> float:
        waits.append(decide())
        return waits[-1]

    sw.next_wait = spied  # type: ignore[method-assign]
    sw.start_thread()
    try:
        wait_for(lambda: waits.count(1.6) >= 2, 30, "the wait backed off to its bound")
        assert waits[:4] == [0.4, 0.8, 1.6, 1.6]
        process.note_work()  # a task starts in this process (worker.py's task_prerun)
        n = len(waits)
        wait_for(lambda: len(waits) > n, 5, "a pass soon after the task")
        assert waits[n] == 0.2
        wait_for(lambda: waits[-1] == 1.6, 30, "idle again")
        state = RunState(rds, settings)
        start_run(state, app, uuid.uuid4().hex[:8])  # an active run: every interval again
        wait_for(lambda: waits[-3:] == [0.2, 0.2, 0.2], 30, "the base interval with work")
    finally:
        sw.stop()


def test_an_unacknowledged_message_counts_as_work_for_the_sweeper(
    rds: redis.Redis, settings: Settings
) -> None:
    """A message a live worker holds (in `unacked_owner`) is one a death would have to give
    back: the pass that sees it keeps the base interval; none held: it backs off."""
    from broker import owners

    bp = f"{settings.key_prefix}:q:"
    s = settings.model_copy(update={"dead_worker_after": 0.001})
    sw = Sweeper(rds, rds, bp, lambda kid: None, s, interval=0.5, stall=30, confirm=0,
                 restore=lambda tags: 0)  # fmt: skip
    wait_for(lambda: owners.serving_for(rds) >= 0.01, 5, "the restart guard passed")
    sw.try_sweep()
    assert not sw.saw_work and sw.next_wait() == 1.0
    rds.set(f"{bp}{owners.ALIVE}holder", "1", ex=60)
    rds.hset(f"{bp}{owners.OWNER_HASH}", "tag-1", "holder")
    rds.delete(sw.lock_key)
    sw.try_sweep()
    assert sw.saw_work and sw.next_wait() == 0.5


def test_a_sweeper_that_lost_the_lock_to_a_busy_one_keeps_the_interval(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    """The holder's pass found work (an active run): it marks the fleet busy, and a process
    whose lock attempt fails keeps the base interval, ready to take over should the holder
    die; a holder that found nothing leaves no mark, and the others back off."""
    sent: list[dict[str, Any]] = []
    holder = sweeper(rds, settings, sent, interval=5)
    other = sweeper(rds, settings, sent, interval=5)
    holder.try_sweep()
    assert not holder.saw_work
    other.try_sweep()  # lost: the holder found nothing
    assert not other.saw_work and other.next_wait() == 10
    rds.delete(holder.lock_key)
    start_run(RunState(rds, settings), app, uuid.uuid4().hex[:8])
    holder.try_sweep()
    assert holder.saw_work
    other.saw_work = False
    other.try_sweep()  # lost to a holder that found work
    assert other.saw_work and other.next_wait() == 5


def test_a_clean_mark_on_a_lost_slot_range_fails_no_pass(
    app: Celery, rds: redis.Redis, settings: Settings, monkeypatch: Any
) -> None:
    """A run's clean mark is a key of its own slot, not the run's: on a cluster with a range
    lost, the mark of a run served elsewhere may be there. Read in the same pipeline as the
    run keys, its error failed the pass for every run (no message re-sent while the range was
    lost); it is left unread (as if none) and unwritten instead. Here one Redis stands for the
    cluster: the mark is a hash, whose GET fails as the lost node's would."""
    from redis.crc import key_slot

    import chains.sweeper as sweeper_mod
    from utils.slots import LostRange

    seed = lost_seed(rds, settings, app)
    rid = next(iter(RunState(rds, settings).active_runs()))
    sent: list[dict[str, Any]] = []
    sw = sweeper(rds, settings, sent)
    slot = key_slot(sw.clean_key(rid).encode())
    assert slot != key_slot(sw.state.run_key(rid).encode())
    lost = [LostRange(slot, slot, "127.0.0.1:1", ())]
    monkeypatch.setattr(sweeper_mod, "lost_ranges", lambda client, fresh=False: lost)
    rds.hset(sw.clean_key(rid), "x", "1")  # any read of it fails
    assert sw.sweep_once() == 1 and [k["id"] for k in sent] == [seed]
    sw.mark_clean([rid])
    assert rds.type(sw.clean_key(rid)) == b"hash"  # not written either


def test_a_re_send_arrives_flagged_redelivered_so_its_begin_looks_up_the_done_set(
    app: Celery, rds: redis.Redis, settings: Settings
) -> None:
    """A task the sweeper thought lost may have committed meanwhile: its re-send carries the
    flag a restored message carries, which is what makes a begin look up the done set
    (a first delivery skips it). A seed goes out unflagged."""
    sweeper = Sweeper.for_app(app, settings)
    assert sweeper is not None
    resent, seed = uuid.uuid4().hex, uuid.uuid4().hex
    sweeper.send({"id": resent, "task": "demo.h5.feed", "params": {}, "meta": {"run": "r"}})
    send_kid(
        app, {"id": seed, "task": "demo.h5.feed", "params": {}, "meta": {"run": "r"}}, queue_for
    )
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(queue_for("demo.h5.feed"), no_ack=True)
        try:
            flags = {}
            for _ in range(2):
                m = queue.get(timeout=10)
                req = Request(m, app=app)  # what a worker makes of it: task.request.delivery_info
                flags[req.id] = req.delivery_info["redelivered"]
        finally:
            queue.close()
    assert flags == {resent: True, seed: False}
