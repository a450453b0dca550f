"""A message requeued because the state store could not take its change (replicas that do
not confirm, a Redis that does not answer) or parked on a lost slot range is not charged:
not as a delivery towards the poison cap (`CHAINCRAWL_MAX_REDELIVERIES`), not as a retry of
its own (docs/reliability.md). Only a worker's death is a redelivery."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
import redis
from celery.exceptions import Reject, Retry

import lifecycle.lost
from base_task import SiteTask
from chains import Chain, step
from config import Settings
from exceptions import Throttled
from ledger.state import RunState
from lifecycle import runtime
from lifecycle.commits import Committer
from lifecycle.endpoints import get_endpoint
from monitor.deadletter import DeadLetterStore
from utils.slots import LostRange, SlotsLost
from utils.wire import TaskMeta

TASK = "testsite.local.detail"
PARAMS = {"entry_id": "e1"}
CAP = 2  # CHAINCRAWL_MAX_REDELIVERIES
CHAIN = orjson.dumps(Chain("c", step(TASK)).to_dict())


@pytest.fixture
def settings(process_settings: Callable[..., Settings]) -> Settings:
    """The process's settings (every part of a page reads them): WAIT for a replica this
    lone Redis does not have, so every change goes unconfirmed."""
    return process_settings(
        REDIS_WAIT_REPLICAS="1", REDIS_WAIT_TIMEOUT="0.01", MAX_REDELIVERIES=str(CAP)
    )


@pytest.fixture
def page(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> SiteTask:
    """The endpoint, its page yielding nothing (no fetch), no pause before a requeue."""
    monkeypatch.setattr(SiteTask, "_collect", lambda self, ctx, p: ([], []))
    monkeypatch.setattr(runtime.time, "sleep", lambda s: None)
    monkeypatch.setattr(lifecycle.lost, "_count", lambda counts: None)
    return get_endpoint(TASK).task


def _deliver(task: SiteTask, meta: dict[str, Any], retries: int = 0) -> str:
    task.push_request(id="t1", retries=retries, hostname="w1")
    try:
        return task.execute(PARAMS, meta)
    finally:
        task.pop_request()


def test_requeues_for_want_of_a_replica_are_not_deliveries(
    page: SiteTask, settings: Settings, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page put back to wait (a limit, an empty pool) while its master has no replica:
    each delivery's retry counters go unconfirmed and the message is requeued, again and
    again. None of it is a worker's death: no PoisonMessage, however long it lasts."""
    state = RunState(rds, settings)
    state.create_run("r1", "c", CHAIN, 5)
    state.add_dispatched("r1", "local.detail", 1)

    def contended(self: SiteTask, ctx: Any, p: Any) -> tuple[list[Any], list[Any]]:
        raise Throttled("testsite.local.detail: over its shared limit", retry_after=1.0)

    monkeypatch.setattr(SiteTask, "_collect", contended)
    meta = {"run": "r1", "step": "local.detail"}
    for _ in range(3 * (CAP + 2)):  # a long outage: far more requeues than the cap
        with pytest.raises(Reject) as info:
            _deliver(page, meta)
        assert getattr(info.value, "requeue", False) is True
    assert DeadLetterStore(rds, settings).list(10) == []  # not dead-lettered as poison
    monkeypatch.setattr(SiteTask, "_collect", lambda self, ctx, p: ([], []))
    settings.redis_wait_replicas = 0  # the replica is back
    assert _deliver(page, meta) == "0 items, 0 follow-ups"
    counters = state.counters("r1")
    assert (counters["succeeded"], counters.get("failed", 0)) == (1, 0), counters
    assert not rds.exists(state.deliveries_key("r1", "t1", 0))  # forgotten with the commit
    assert rds.hget(settings.key("metrics", "task", TASK), "redelivered") is None


def test_a_redis_gone_in_the_middle_of_a_page_again_and_again_is_no_poison(
    page: SiteTask, settings: Settings, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis dies after a page began (its delivery counted) and before its commit, more
    times than the cap: each time the commit fails, the message is requeued, its delivery
    cannot be taken back then (Redis is away) and is taken back before the next delivery
    in the process begins. The page then commits once, never dead-lettered as poison."""
    settings.redis_wait_replicas = 0
    state = RunState(rds, settings)
    state.create_run("r1", "c", CHAIN, 5)
    state.add_dispatched("r1", "local.detail", 1)
    down = [False]
    begin, evaluate, finish = RunState.begin, redis.Redis.eval, Committer.finish

    def away(what: str) -> redis.ConnectionError:
        return redis.ConnectionError(f"Error 111 connecting to 127.0.0.1:1. {what}")

    def begin_unless_down(self: RunState, *a: Any) -> Any:
        if down[0]:
            raise away("begin")
        return begin(self, *a)

    def eval_unless_down(self: redis.Redis, *a: Any) -> Any:
        if down[0]:
            raise away("eval")
        return evaluate(self, *a)

    def dies_before_the_commit(self: Committer, app: Any) -> None:
        down[0] = True  # Redis killed while the page ran
        raise away("commit")

    monkeypatch.setattr(RunState, "begin", begin_unless_down)
    monkeypatch.setattr(redis.Redis, "eval", eval_unless_down)
    monkeypatch.setattr(Committer, "finish", dies_before_the_commit)
    meta = {"run": "r1", "step": "local.detail"}
    for _ in range(CAP + 2):  # more restarts than the cap
        for _ in range(2):  # the delivery that met the death, one while Redis is away
            with pytest.raises(Reject):
                _deliver(page, meta)
        down[0] = False  # Redis is back (the supervisor restarted it)
    monkeypatch.setattr(Committer, "finish", finish)
    assert _deliver(page, meta) == "0 items, 0 follow-ups"
    assert DeadLetterStore(rds, settings).list(10) == []
    counters = state.counters("r1")
    assert (counters["succeeded"], counters.get("failed", 0)) == (1, 0), counters
    assert rds.hget(settings.key("metrics", "task", TASK), "redelivered") is None


def test_a_worker_death_is_still_a_redelivery(
    page: SiteTask, settings: Settings, rds: redis.Redis
) -> None:
    """Deliveries begun and never ended (the worker died) count: past the cap, poison."""
    settings.redis_wait_replicas = 0
    state = RunState(rds, settings)
    state.create_run("r1", "c", CHAIN, 5)
    state.add_dispatched("r1", "local.detail", 1)
    for _ in range(CAP + 1):  # begun, then the worker died: nothing ended them
        state.begin("r1", "t1", 0)
    assert _deliver(page, {"run": "r1", "step": "local.detail"}) == "failed: PoisonMessage"
    (dl,) = DeadLetterStore(rds, settings).list(10)
    assert dl.error_type == "PoisonMessage"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every page meets a lost slot range (parked); the retries it sends, as `retry`'s keywords."""
    lost = [LostRange(0, 16383, "127.0.0.1:17102", ())]
    retries: list[dict[str, Any]] = []

    def met_lost(self: SiteTask, params: Any, wire: Any, begun: Any = None) -> str:
        raise SlotsLost(lost)

    def retried(self: SiteTask, **kw: Any) -> Exception:
        retries.append(kw)
        return Retry("parked", kw["exc"])

    monkeypatch.setattr(SiteTask, "run_page", met_lost)
    monkeypatch.setattr(SiteTask, "retry", retried)
    return retries


def test_a_message_parked_on_a_lost_range_spends_no_retry(
    page: SiteTask, sent: list[dict[str, Any]]
) -> None:
    """Parked (sent again as a retry of the same attempt), its retry budget is untouched:
    each park is a wait, not a retry the page's own errors would have spent."""
    wire: dict[str, Any] = {"run": "r1", "step": "local.detail"}
    for n in range(5):
        lifecycle.lost.LOST._last.clear()  # each park's message comes a countdown later
        with pytest.raises(Retry):
            _deliver(page, wire, retries=n)
        wire = sent[-1]["args"][1]
        meta = TaskMeta.from_wire(wire)
        assert (n + 1) + meta.retry_base - meta.waits == 0, wire  # retries used: none


def test_a_copy_of_a_message_parked_a_moment_ago_is_dropped_not_parked_again(
    page: SiteTask, sent: list[dict[str, Any]]
) -> None:
    """A second delivery of a task this process parked less than a countdown before (a
    redelivered or re-sent copy) is acknowledged without a new message: every copy parked
    sent one more, so the copies of a parked task multiplied over a long loss."""
    lifecycle.lost.LOST._last.clear()
    wire: dict[str, Any] = {"run": "r1", "step": "local.detail"}
    with pytest.raises(Retry):
        _deliver(page, wire)
    for _ in range(3):  # copies of the same message within the countdown
        assert _deliver(page, wire) == "parked already"
    assert len(sent) == 1


def test_each_requeue_while_redis_is_away_is_taken_back(
    settings: Settings, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same message begun (counted) and requeued three times before Redis takes the
    uncount: three deliveries taken back, not one."""
    state = RunState(rds, settings)
    key = state.deliveries_key("r1", "t1", 0)
    rds.set(key, 3)
    evaluate = redis.Redis.eval

    def away(self: redis.Redis, *a: Any) -> Any:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:1.")

    monkeypatch.setattr(redis.Redis, "eval", away)
    for _ in range(3):
        lifecycle.lost.uncount_delivery(state, "r1", "t1", 0)
    monkeypatch.setattr(redis.Redis, "eval", evaluate)
    lifecycle.lost.uncount_pending(lambda: state)
    assert rds.get(key) == b"0" and not lifecycle.lost._UNCOUNTED
