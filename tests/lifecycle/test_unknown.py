"""A task the worker does not know: failed, dead-lettered naming the fix, marked, counted."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest
import redis

from broker.workers import TaskSets
from config import Settings
from ledger.state import RunState
from lifecycle.unknown import dead_letter_unknown, entry_of
from monitor.deadletter import DeadLetterStore


def test_entry_of_reads_a_protocol_2_message_and_tolerates_garbage() -> None:
    e = entry_of({"id": "t1", "task": "s.new"}, [[{"a": 1}, {"run": "r", "step": "s.new"}], {}, {}])
    assert e == {"id": "t1", "task": "s.new", "params": {"a": 1},
                 "meta": {"run": "r", "step": "s.new"}}  # fmt: skip
    assert entry_of({"id": "t2", "task": "x"}, None)["params"] == {}
    assert entry_of({}, [["not params", 3]])["meta"] == {}


def test_an_unknown_task_fails_so_its_run_ends_and_its_dead_letter_names_the_fix(
    rds: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    s = Settings(redis_url=redis_url, key_prefix=key_prefix)
    state = RunState(rds, s)
    rid, tid = uuid.uuid4().hex[:8], uuid.uuid4().hex
    state.create_run(rid, "c", b"{}", 5)
    msg = {"id": tid, "task": "local.new", "params": {"n": 1}, "meta": {"run": rid, "step": "r"}}
    state.enqueue_and_release(rid, "r", [orjson.dumps(msg)], s.key("kids", "x"))
    dead_letter_unknown(state, s, msg, "w1@host")
    assert state.info(rid)["status"] == "done"
    c = state.counters(rid)
    assert c["failed"] == 1 and c["r:failed"] == 1 and c["outstanding"] == 0
    dl = DeadLetterStore(rds, s).get(tid)
    assert dl is not None and dl.error_type == "NotRegistered" and dl.params == {"n": 1}
    assert "w1@host" in dl.error and "restart the workers so they load local.new" in dl.error
    sets = TaskSets(rds, s)
    assert sets.unknown([tid]) == {tid} and sets.unknown_total() == 1
    task_metrics = rds.hgetall(s.key("metrics", "task", "local.new"))
    assert task_metrics[b"failed:NotRegistered"] == b"1"


def test_an_unknown_task_delivered_again_is_counted_once(
    rds: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    """A redelivery (a batch's, a re-send's) finds the task committed: its dead letter is
    written again (the same), its count and metrics are not added again."""
    s = Settings(redis_url=redis_url, key_prefix=key_prefix)
    state = RunState(rds, s)
    rid, tid = uuid.uuid4().hex[:8], uuid.uuid4().hex
    state.create_run(rid, "c", b"{}", 5)
    msg = {"id": tid, "task": "local.new", "params": {"n": 1}, "meta": {"run": rid, "step": "r"}}
    state.enqueue_and_release(rid, "r", [orjson.dumps(msg)], s.key("kids", "x"))
    dead_letter_unknown(state, s, msg, "w1@host")
    dead_letter_unknown(state, s, msg, "w2@host")
    assert state.counters(rid)["failed"] == 1
    assert TaskSets(rds, s).unknown_total() == 1
    task_metrics = rds.hgetall(s.key("metrics", "task", "local.new"))
    assert task_metrics[b"failed:NotRegistered"] == b"1" and task_metrics[b"started"] == b"1"
    assert DeadLetterStore(rds, s).get(tid) is not None


def test_an_unknown_task_whose_commit_pipeline_failed_after_the_commit_is_counted_once(
    rds: redis.Redis, redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit script answered committed, another part of its pipeline failed (the call
    raises): counted then, and not by the redelivery, which finds it committed."""
    s = Settings(redis_url=redis_url, key_prefix=key_prefix)
    state = RunState(rds, s)
    rid, tid = uuid.uuid4().hex[:8], uuid.uuid4().hex
    state.create_run(rid, "c", b"{}", 5)
    msg = {"id": tid, "task": "local.new", "params": {}, "meta": {"run": rid, "step": "r"}}
    state.enqueue_and_release(rid, "r", [orjson.dumps(msg)], s.key("kids", "x"))
    real = state.run_commits

    def failing(*args: Any, **kw: Any) -> Any:
        real(*args, **kw)
        raise redis.exceptions.ConnectionError("a master away")

    monkeypatch.setattr(state, "run_commits", failing)
    with pytest.raises(redis.exceptions.ConnectionError):
        dead_letter_unknown(state, s, msg, "w1@host")
    monkeypatch.setattr(state, "run_commits", real)
    dead_letter_unknown(state, s, msg, "w1@host")
    assert state.counters(rid)["failed"] == 1 and TaskSets(rds, s).unknown_total() == 1
    task_metrics = rds.hgetall(s.key("metrics", "task", "local.new"))
    assert task_metrics[b"failed:NotRegistered"] == b"1"
