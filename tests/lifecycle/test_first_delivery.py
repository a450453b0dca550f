"""A page's begin on a first delivery: no done-set lookup and, with the run's hold known from
the process's last second, no read at all. A copy of a committed task the broker did not flag
(a re-send that raced its commit) runs its page again: its commit is refused and what the
first commit staged is sent, so it costs a fetch, never a second commit. A cancel reaches the
next begins through the reply of the process's next commit."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pytest
import redis

from base_task import SiteTask
from chains import Chain, step
from config import Settings
from ledger.state import Kid, RunState
from lifecycle import runtime
from lifecycle.endpoints import get_endpoint
from monitor.metrics import aggregator

TASK = "testsite.local.detail"
CHAIN = orjson.dumps(Chain("c", step(TASK)).to_dict())
META = {"run": "r1", "step": "local.detail"}


@pytest.fixture
def settings(process_settings: Callable[..., Settings]) -> Settings:
    """The process's settings (every part of a page reads them), on this test's Redis."""
    return process_settings()


@pytest.fixture
def page(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> SiteTask:
    """The endpoint, its page yielding nothing; the fetches it would make counted."""
    fetched: list[str] = []

    def collect(self: SiteTask, ctx: Any, p: Any) -> tuple[list[Any], list[Any]]:
        fetched.append(p.entry_id)
        return [], []

    monkeypatch.setattr(SiteTask, "_collect", collect)
    task = get_endpoint(TASK).task
    task.fetched = fetched
    return task


def deliver(task: SiteTask, tid: str, redelivered: bool = False) -> str:
    task.push_request(id=tid, retries=0, hostname="w1", delivery_info={"redelivered": redelivered})
    try:
        return str(task.execute({"entry_id": tid}, dict(META)))
    finally:
        task.pop_request()


def test_an_unflagged_copy_of_a_committed_task_is_refused_and_sends_what_was_staged(
    page: SiteTask, settings: Settings, rds: redis.Redis
) -> None:
    state = RunState(rds, settings)
    state.create_run("r1", "c", CHAIN, 5)
    state.add_dispatched("r1", "local.detail", 1)
    kids = tuple(
        Kid("local.detail", TASK, {"entry_id": f"k{n}"}, dict(META), uuid.uuid4().hex)
        for n in range(2)
    )
    assert state.commit(rid="r1", tid="t1", step="local.detail", outcome="succeeded", kids=kids)
    assert len(state.staged("r1", "t1")) == 2  # committed, its children not sent yet
    rds.config_resetstat()
    deliver(page, "t1")  # a copy the broker did not flag: fetched again
    assert page.fetched == ["t1"]  # type: ignore[attr-defined]
    assert "cmdstat_smismember" not in rds.info("commandstats")
    counters = state.counters("r1")
    assert (counters["succeeded"], counters["dispatched"]) == (1, 3), counters  # once
    assert state.staged("r1", "t1") == []  # the first commit's children sent
    # this test's queues only: the suite's other tests share the Redis, each on its own prefix
    # the children's messages, by their ids: the suite's other tests share this Redis and its
    # unprefixed queue
    sent = [
        m
        for k in rds.scan_iter("*testsite*")
        if rds.type(k) == b"list"
        for m in rds.lrange(k, 0, -1)
    ]
    assert sum(any(k.task_id.encode() in m for k in kids) for m in sent) == 2, sent
    aggregator().flush(rds)  # its metrics: a duplicate, not a second success
    m = rds.hgetall(settings.key("metrics", "task", TASK))
    assert (int(m[b"succeeded"]), int(m[b"duplicate"]), int(m[b"started"])) == (0, 1, 1), m


def test_a_cancel_reaches_the_next_begin_through_a_commit_and_a_begin_reads_nothing(
    page: SiteTask, settings: Settings, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = RunState(rds, settings)
    state.create_run("r1", "c", CHAIN, 5)
    state.add_dispatched("r1", "local.detail", 3)
    begins: list[Any] = []  # each begin's known holds (a begin that knows them sends nothing:
    begin_many = RunState.begin_many  # tests/ledger/test_begin.py)

    def spy(self: RunState, *a: Any, **kw: Any) -> Any:
        begins.append(kw.get("known"))
        return begin_many(self, *a, **kw)

    monkeypatch.setattr(RunState, "begin_many", spy)
    assert deliver(page, "a") == "0 items, 0 follow-ups"  # its begin reads the run
    assert deliver(page, "b") == "0 items, 0 follow-ups"  # known from a's commit
    assert begins == [None, {"r1": ""}], begins
    state.cancel("r1", "test")
    rt = runtime.current()
    assert rt.known_hold("r1") == ""  # known for a second: the last commit's reply
    rt.note_hold("r1", "", at=0.0)  # a second later
    assert rt.known_hold("r1") is None
    assert deliver(page, "c") == "cancelled"  # read again: cancelled, not fetched
    assert page.fetched == ["a", "b"]  # type: ignore[attr-defined]
    assert rt.known_hold("r1") == "cancelled"


def test_a_refused_copy_is_not_left_counted_succeeded_until_the_next_flush(
    page: SiteTask, settings: Settings, rds: redis.Redis
) -> None:
    """The copy's `succeeded` went with its commit's pipeline: its recount as a duplicate is
    written at once, not a flush interval later (a reader right after the run saw 1 too many)."""
    state = RunState(rds, settings)
    state.create_run("r1", "c", CHAIN, 5)
    state.add_dispatched("r1", "local.detail", 1)
    assert state.commit(rid="r1", tid="t1", step="local.detail", outcome="succeeded")
    deliver(page, "t1")  # an unflagged copy: runs, its commit refused
    m = rds.hgetall(settings.key("metrics", "task", TASK))  # no flush in between
    assert int(m.get(b"succeeded", 0)) == 0, m
    assert int(m.get(b"duplicate", 0)) == 1, m
