"""The commit-to-publish path against a private Redis: the commit returns what it staged,
EVALSHA survives a flushed script cache, children are planned into batches by backlog, the raw
envelopes are real kombu messages, and a failed publish after a commit requeues."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import orjson
import pytest
import redis
from celery import Celery
from celery.exceptions import Reject
from kombu import Connection

import lifecycle.batch
from base_task import SiteTask
from chains.sweeper import message_ids
from config import Settings, reset_settings
from ledger.publish import (
    BATCH_TASK,
    FANOUT_MESSAGES,
    CpuMeter,
    Load,
    Publisher,
    batch_size,
    broker_priority,
)
from ledger.state import Kid, RunState
from lifecycle import runtime
from lifecycle.commits import Committer
from lifecycle.endpoints import get_endpoint, queue_for

TASK = "testsite.local.detail"


@pytest.fixture
def settings(redis_url: str, key_prefix: str) -> Settings:
    return Settings(redis_url=redis_url, broker_url=redis_url, key_prefix=key_prefix, batch=4,
                    batch_backlog=10)  # fmt: skip


@pytest.fixture
def app(settings: Settings) -> Iterator[Celery]:
    """A Celery app with the workers' transport options (worker.configure)."""
    a = Celery("send-path-test", set_as_current=False)
    a.conf.update(
        broker_url=settings.broker_url,
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


def kid(n: int, queue: str = "testsite", prio: int | None = None, task: str = TASK) -> Kid:
    meta: dict[str, Any] = {"run": "r1", "step": "s", "queue": queue}
    if prio is not None:
        meta["prio"] = prio
    return Kid("s", task, {"entry_id": f"e{n}", "token": "SECRET"}, meta, uuid.uuid4().hex)


def commit(state: RunState, tid: str, kids: list[Kid]) -> Any:
    return state.commit(rid="r1", tid=tid, step="s", outcome="succeeded", n_items=0,
                        entries=(), kids=kids)  # fmt: skip


def test_commit_returns_its_staged_children_once(rds: redis.Redis, settings: Settings) -> None:
    state = RunState(rds, settings)
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 1)
    kids = [kid(i) for i in range(3)]
    res = commit(state, "t1", kids)
    assert res is not None and res.outstanding == 3  # 1 - 1 + 3
    assert [orjson.loads(m)["id"] for m in res.staged] == [k.task_id for k in kids]
    assert commit(state, "t1", kids) is None  # a second commit of the same task id: nothing
    assert state.counters("r1")["outstanding"] == 3
    rds.script_flush()  # a restarted Redis has no scripts: EVALSHA reloads and goes on
    res = commit(state, "t2", [])
    assert res is not None and res.outstanding == 2 and res.staged == []


def test_deferred_commits_go_in_one_round_trip(rds: redis.Redis, settings: Settings) -> None:
    state = RunState(rds, settings)
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 2)
    calls: list[Any] = []
    calls.append(state.commit_call(rid="r1", tid="a", step="s", outcome="succeeded",
                                   kids=[kid(1)]))  # fmt: skip
    calls.append(state.commit_call(rid="r1", tid="a", step="s", outcome="succeeded",
                                   kids=[kid(2)]))  # fmt: skip
    calls.append(state.commit_call(rid="r1", tid="b", step="s", outcome="failed"))
    first, dup, other = state.run_commits(calls)
    assert first is not None and len(first.staged) == 1
    assert dup is None  # the same task id twice in one pipeline still commits once
    assert other is not None and other.outstanding == 1
    assert state.begin_many([("r1", "a", 0), ("r1", "zz", 0)]) == (
        [(True, 1, False, False), (False, 1, False, False)],
        0,
    )
    assert state.begin_many([("r1", "a", 0), ("r1", "zz", 0)], batch_id="b1") == (
        [(True, 0, False, False), (False, 0, False, False)],
        1,
    )
    assert state.begin_many([("r1", "zz", 0)], batch_id="b1")[1] == 2


def test_plan_batches_only_a_deep_backlog(
    settings: Settings, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    pub = Publisher(app, settings, queue_for)
    kids = [orjson.loads(kid(i).encode()) for i in range(10)]
    shallow = pub.plan(kids, outstanding=9)
    assert [m.task for m in shallow] == [TASK] * 10 and [m.id for m in shallow] == [
        k["id"] for k in kids
    ]
    deep = pub.plan(kids, outstanding=10)
    assert [m.task for m in deep] == [BATCH_TASK] * 3  # 10 in messages of <= 4
    assert [len(m.args[0]) for m in deep] == [4, 3, 3]
    assert [e for m in deep for e in m.args[0]] == kids  # entries are exactly Kid.encode()
    assert all("SECRET" not in m.argsrepr and "***" in m.argsrepr for m in deep + shallow)
    # auto sizing: never fewer than two messages per slot of the worker
    auto = Settings(**{**settings.model_dump(), "batch_backlog": 0})
    # a CPU-bound worker sharing its cores (ledger/publish.py): 0.6 of a core used, 0.4 waited for
    clock = {"wall": 100.0, "cpu": 0.0, "wait": 0.0}
    meter = CpuMeter(0.125, lambda: clock["wall"], lambda: clock["cpu"], lambda: clock["wait"])
    load = Load(4, busy=meter.demand, side_by_side=lambda: False)
    meter.demand()
    clock.update(wall=100.125, cpu=0.075, wait=0.05)
    assert [batch_size(auto, n, load) for n in (7, 8, 12, 1000)] == [1, 2, 3, 4]
    clock.update(wall=100.25, cpu=0.15, wait=0.05)  # 0.6 used, nothing waited: latency-bound
    assert [batch_size(auto, n, load) for n in (7, 8, 12, 1000)] == [1, 1, 1, 1]
    load.busy = lambda: 0.6  # a latency-bound parse burst
    assert [batch_size(auto, n, load) for n in (15, 16, 24, 1000)] == [1, 1, 1, 1]
    load.busy = lambda: 0.8  # busy: two messages per slot
    assert [batch_size(auto, n, load) for n in (15, 16, 24, 1000)] == [1, 2, 3, 4]
    load.busy = lambda: 0.95  # CPU-bound: 4 messages suffice
    assert [batch_size(auto, n, load) for n in (7, 8, 12, 1000)] == [1, 2, 3, 4]
    load.busy = lambda: 0.8
    planned = Publisher(app, auto, queue_for, load).plan(kids, 24)
    assert [len(m.args[0]) for m in planned] == [3, 3, 2, 2]  # evenly filled
    assert {m.task for m in planned} == {BATCH_TASK}
    # children of different destinations never share a message
    mixed = [orjson.loads(k.encode()) for k in (kid(1), kid(2, queue="q2"), kid(3, prio=9))]
    assert [m.task for m in pub.plan(mixed, outstanding=100)] == [TASK] * 3


def test_gevent_batches_latency_bound_work_and_counts_slots_up_to_two_batches(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under gevent a batch runs its pages side by side (`_side_by_side`): no CPU floor, and
    a worker's slots count only up to 2 x `batch` (one message keeps `batch` slots busy)."""
    auto = Settings(**{**settings.model_dump(), "batch_backlog": 0, "batch": 20})
    gevent = {"on": False}
    load = Load(20, busy=lambda: 0.3, side_by_side=lambda: gevent["on"])  # latency-bound
    assert [batch_size(auto, n, load) for n in (80, 400, 5000)] == [1, 1, 1]
    gevent["on"] = True
    # two messages per slot still: 40 messages, then pages per message
    assert [batch_size(auto, n, load) for n in (79, 80, 400, 5000)] == [1, 2, 10, 20]
    load.slots = 256
    # 256 slots count as 40 (2 x 20): 80 messages, not 512
    assert [batch_size(auto, n, load) for n in (159, 160, 800, 5000)] == [1, 2, 10, 20]
    load.busy = lambda: 0.95  # CPU-bound: a quarter of that
    assert [batch_size(auto, n, load) for n in (39, 40, 200, 5000)] == [1, 2, 10, 20]
    # without the floor to skip, `cpu_floor=False` (the tail rule) is the same rule
    assert [batch_size(auto, n, load, cpu_floor=False) for n in (39, 40, 200)] == [1, 2, 10]


def test_gevent_packs_a_shallow_fan_out_into_a_few_messages(
    settings: Settings, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under gevent a group of children goes in at most FANOUT_MESSAGES messages, `batch`
    allowing, however shallow the backlog; threads, an explicit backlog rule and pages a batch
    hands out keep one page per message below the backlog."""
    auto = Settings(**{**settings.model_dump(), "batch_backlog": 0, "batch": 20})
    gevent = {"on": False}
    load = Load(256, busy=lambda: 0.3, side_by_side=lambda: gevent["on"])
    pub = Publisher(app, auto, queue_for, load)
    kids = [orjson.loads(kid(i).encode()) for i in range(10)]
    assert [m.task for m in pub.plan(kids, 11)] == [TASK] * 10
    gevent["on"] = True
    assert FANOUT_MESSAGES == 4
    planned = pub.plan(kids, 11)
    assert [len(m.args[0]) for m in planned] == [3, 3, 2, 2]
    assert {m.task for m in planned} == {BATCH_TASK}
    assert [e for m in planned for e in m.args[0]] == kids
    assert [m.task for m in pub.plan(kids[:4], 5)] == [TASK] * 4  # four: one each still
    many = [orjson.loads(kid(i).encode()) for i in range(100)]
    assert [len(m.args[0]) for m in pub.plan(many, 101)] == [20] * 5  # capped by `batch`
    assert [m.task for m in pub.plan(kids, 11, spread=False)] == [TASK] * 10
    mixed = [orjson.loads(kid(i, queue="q2" if i % 2 else "testsite").encode()) for i in range(10)]
    sizes = sorted(len(m.args[0]) if m.task == BATCH_TASK else 1 for m in pub.plan(mixed, 11))
    assert sizes == [1, 1, 2, 2, 2, 2]  # each destination by itself: 5 in 2, 2, 1
    fixed = Settings(**{**auto.model_dump(), "batch_backlog": 50})  # the user's own rule
    assert [m.task for m in Publisher(app, fixed, queue_for, load).plan(kids, 11)] == [TASK] * 10
    one = Settings(**{**auto.model_dump(), "batch": 1})
    assert [m.task for m in Publisher(app, one, queue_for, load).plan(kids, 11)] == [TASK] * 10


def test_a_batch_page_with_children_sends_them_at_once_in_the_tail_or_with_cpu_to_spare(
    settings: Settings,
) -> None:
    """`Runtime.send_kids_now`: in its run's tail (or a run not seen yet) or on a worker with
    CPU to spare a batch's page commits and sends its children itself; a CPU-bound worker deep
    in a run leaves them to the batch's one commit."""
    rt = runtime.Runtime(settings, 4)
    tail = rt.load.tail_backlog()
    assert rt.send_kids_now("r1")  # not seen yet
    assert rt.send_kids_now("")  # no run
    rt.note_outstanding("r1", tail - 1)
    rt.load.busy = lambda: 0.99
    assert rt.send_kids_now("r1")  # the tail, CPU-bound or not
    rt.note_outstanding("r1", tail)
    assert not rt.send_kids_now("r1")  # deep and CPU-bound: the batch's one commit
    rt.load.busy = lambda: 0.3
    assert rt.send_kids_now("r1")  # deep, latency-bound


def test_a_running_batch_hands_out_its_pages_only_in_its_runs_tail(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Runtime.unbatch`: a batch splits once its run's backlog (as this process last saw it)
    would publish one page per message; mid-run it keeps its pages, whatever a 0.1 s window
    reads."""
    rt = runtime.Runtime(settings, 4)
    assert not rt.unbatch("r1")  # no reading yet: keep going
    rt.note_outstanding("r1", 10)
    assert not rt.unbatch("r1")  # backlog mode (10): deep enough
    rt.note_outstanding("r1", 9)
    assert rt.unbatch("r1")
    assert not rt.unbatch("")  # no run: nothing to judge by
    auto = Settings(**{**settings.model_dump(), "batch_backlog": 0})
    rt = runtime.Runtime(auto, 4)
    rt.load.busy = lambda: 0.3  # a quiet window mid-run
    rt.note_outstanding("r1", 16)  # 2 x (two messages per slot x 4 slots): batches still pay
    assert not rt.unbatch("r1")
    rt.note_outstanding("r1", 15)
    assert rt.unbatch("r1")
    rt.load.busy = lambda: 0.95  # CPU-bound: 4 messages suffice
    assert not rt.unbatch("r1")
    rt.note_outstanding("r1", 7)
    assert rt.unbatch("r1")
    one = Settings(**{**auto.model_dump(), "batch": 1})
    rt = runtime.Runtime(one, 4)
    rt.note_outstanding("r1", 7)
    assert not rt.unbatch("r1")


def test_pages_a_batch_hands_out_go_to_the_head_of_their_queue(
    rds: redis.Redis, settings: Settings, app: Celery
) -> None:
    """They were due already: the next BRPOP takes them, in their order, before the backlog
    and before the children published with them."""
    state = RunState(rds, settings)
    pub = Publisher(app, settings, queue_for)
    backlog, kids, rest = (
        [kid(i) for i in range(3)],
        [kid(i) for i in range(3, 5)],
        [kid(5), kid(6)],
    )
    pub.publish(state, [([k.encode() for k in backlog], state.staged_at("", "a"))], outstanding=1)
    pub.publish(state, [([k.encode() for k in kids], state.staged_at("", "b"))], outstanding=1,
                front=[orjson.loads(k.encode()) for k in rest])  # fmt: skip
    pub.publish(state, [], outstanding=1, front=[])  # nothing to send: no round trip fails
    opts = app.conf.broker_transport_options
    with Connection(settings.broker_url, transport_options=opts) as conn:
        q = conn.SimpleQueue("testsite")
        order = []
        for _ in range(7):
            m = q.get(timeout=5)
            order.append(m.headers["id"])
            m.ack()
        q.close()
    assert order == [k.task_id for k in rest + backlog + kids]


def test_raw_envelopes_are_kombu_messages(
    rds: redis.Redis, settings: Settings, app: Celery
) -> None:
    state = RunState(rds, settings)
    pub = Publisher(app, settings, queue_for)
    kids = [kid(i, prio=2) for i in range(5)]
    rds.rpush(state.kids_key("", "t"), *[k.encode() for k in kids])
    pub.publish(state, [([k.encode() for k in kids], state.staged_at("", "t"))], outstanding=100)
    assert not rds.exists(state.kids_key("", "t"))  # the staging list goes in the same pipeline
    raw = rds.lrange(f"{settings.key_prefix}:q:testsite:{broker_priority(2)}", 0, -1)
    assert {k.task_id for k in kids} <= {
        i for m in raw for i in message_ids(m)
    }  # the sweeper's view
    opts = app.conf.broker_transport_options
    with Connection(settings.broker_url, transport_options=opts) as conn:
        q = conn.SimpleQueue("testsite")
        got = []
        for _ in range(2):  # 5 children, batches of <= 4: 3 + 2
            m = q.get(timeout=5)
            got.append(m)
            m.ack()
        q.close()
    assert {m.headers["task"] for m in got} == {BATCH_TASK}
    entries = [e for m in got for e in m.payload[0][0]]
    assert sorted(e["id"] for e in entries) == sorted(k.task_id for k in kids)
    assert all(m.properties["priority"] == broker_priority(2) for m in got)
    assert all(m.headers["id"] == m.properties["correlation_id"] for m in got)


def test_a_publish_failure_after_the_commit_requeues_and_keeps_the_children(
    rds: redis.Redis, settings: Settings, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = RunState(rds, settings)
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 1)
    res = commit(state, "t1", [kid(1), kid(2)])
    task: SiteTask = get_endpoint(TASK).task

    class Broken(Publisher):
        def publish(self, *a: Any, **kw: Any) -> None:
            raise OSError("broker connection pool exhausted")

    rt = runtime.Runtime(settings)
    monkeypatch.setattr(rt, "publisher", lambda a: Broken(app, settings, queue_for))
    page = Committer(rt, state, "r1", task.name)
    page.stage("t1", res)
    with pytest.raises(Reject) as info:
        page.publish(app)
    assert cast(Any, info.value).requeue is True  # celery-stubs omit Reject.requeue
    assert len(state.staged("r1", "t1")) == 2  # still staged for the redelivery
    # the redelivery finds the task committed and sends what is staged (read back)
    monkeypatch.setattr(rt, "publisher", lambda a: Publisher(app, settings, queue_for))
    again = Committer(rt, state, "r1", task.name)
    again.stage("t1")
    again.publish(app)
    assert not rds.hexists(state.staged_key("r1"), "t1")
    assert rds.llen(f"{settings.key_prefix}:q:testsite") == 2


@pytest.fixture
def process_on_test_redis(redis_url: str, key_prefix: str) -> Iterator[None]:
    """The process's settings (and so its runtime) on this test's Redis: a requeue takes its
    delivery back there, whatever an earlier test left the process's settings pointing at."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHAINCRAWL_REDIS_URL", redis_url)
        mp.setenv("CHAINCRAWL_KEY_PREFIX", key_prefix)
        reset_settings()
        yield
    reset_settings()


def test_an_unreachable_state_store_pauses_the_slot_before_requeueing(
    app: Celery, process_on_test_redis: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the broker elsewhere a requeued message comes straight back: each slot waits
    `REQUEUE_PAUSE` first instead of spinning through the queue while Redis is down."""
    task: SiteTask = get_endpoint(TASK).task
    pauses: list[float] = []
    me = threading.get_ident()
    sleep = time.sleep

    def record(seconds: float) -> None:  # this thread's sleeps only
        if threading.get_ident() == me:
            pauses.append(seconds)
        else:
            sleep(seconds)

    monkeypatch.setattr(runtime.time, "sleep", record)

    def down(*a: Any, **kw: Any) -> str:
        raise redis.exceptions.ConnectionError("Connection refused")

    monkeypatch.setattr(SiteTask, "run_page", down)
    with pytest.raises(Reject) as info:
        task.execute({}, {})
    assert cast(Any, info.value).requeue is True and pauses == [runtime.REQUEUE_PAUSE]
    monkeypatch.setattr(lifecycle.batch, "_run_batch", down)
    with pytest.raises(Reject):
        lifecycle.batch.run_batch([])
    assert pauses == [runtime.REQUEUE_PAUSE] * 2


def test_a_page_committed_alone_inside_a_batch_sends_its_children_with_the_batchs_publish(
    rds: redis.Redis, settings: Settings, app: Celery
) -> None:
    """A skipped, failed or cancelled entry of a batch commits at once (its dead letter and
    metrics go with it) and hands what its commit staged to the batch: one publish for all."""
    state = RunState(rds, settings)
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 2)
    rt = runtime.Runtime(settings)
    batch = Committer(rt, state, "r1", BATCH_TASK)
    page = Committer(rt, state, "r1", TASK)
    call = state.commit_call(rid="r1", tid="t1", step="s", outcome="skipped", kids=[kid(1), kid(2)])
    page.add(call, TASK)
    (res,) = page.commit()
    assert res is not None and len(page.groups) == 1
    batch.absorb(page)
    assert page.groups == [] and len(batch.groups) == 1
    assert rds.llen(f"{settings.key_prefix}:q:testsite") == 0  # nothing sent before the batch's
    batch.publish(app)
    assert rds.llen(f"{settings.key_prefix}:q:testsite") == 2
    assert not rds.hexists(state.staged_key("r1"), "t1")
    again = Committer(rt, state, "r1", TASK)  # a second delivery of the same skip
    again.add(call, TASK)
    assert again.commit(read_back=False) == [None] and again.groups == []
