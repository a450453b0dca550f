"""The run's wake list: the ledger's scripts push to it when a run may have ended ('e') or,
while a progress view watches it, on every commit ('p'); `RunHandle.wait()` blocks on it."""

from __future__ import annotations

import uuid
from typing import cast

import pytest
import redis

from config import Settings
from external_interface.storage.outbox import Drainer, xadd_entry
from external_interface.storage.sinks.jsonl import JsonlSink
from ledger.state import CommitCall, RunState
from utils.keyspace import Keyspace


@pytest.fixture
def state(rds: redis.Redis, redis_url: str, key_prefix: str) -> RunState:
    return RunState(rds, Settings(redis_url=redis_url, key_prefix=key_prefix))


def started(state: RunState, tasks: int) -> str:
    rid = uuid.uuid4().hex[:12]
    state.create_run(rid, "c", b"{}", 5)
    state.add_dispatched(rid, "s", tasks)
    return rid


def commit(state: RunState, rid: str, n_items: int = 0) -> None:
    """A task's commit counting `n_items` (its outbox entries written apart, as a test wants)."""
    call: CommitCall = state.commit_call(
        rid=rid, tid=uuid.uuid4().hex, step="s", outcome="succeeded", n_items=n_items, entries=()
    )
    state.run_commits([call])


def wakes(rds: redis.Redis, state: RunState, rid: str) -> list[bytes]:
    return list(cast("list[bytes]", rds.lrange(state.wake_key(rid), 0, -1)))


def test_the_scripts_name_the_wake_list_as_the_keyspace_does(state: RunState) -> None:
    assert state.wake_key("r9") == state.run_key("r9") + ":wake"
    assert Keyspace("cc").wake("r9") == "cc:run:{r9}:wake"


def test_the_last_commit_wakes_the_waiter_and_earlier_ones_do_not(
    state: RunState, rds: redis.Redis
) -> None:
    rid = started(state, 2)
    commit(state, rid)
    assert wakes(rds, state, rid) == []  # nobody watches: a commit costs no push
    commit(state, rid)
    assert wakes(rds, state, rid) == [b"e"]
    assert 0 < rds.ttl(state.wake_key(rid)) <= 60
    assert state.next_wake(rid, 1.0) == b"e"
    assert state.next_wake(rid, 0.05) is None  # popped: one wake per event


def test_a_watched_run_wakes_on_every_commit_and_keeps_one_element(
    state: RunState, rds: redis.Redis
) -> None:
    rid = started(state, 3)
    state.watch(rid, 30)
    commit(state, rid)
    commit(state, rid)
    assert wakes(rds, state, rid) == [b"p"]
    commit(state, rid)
    assert wakes(rds, state, rid) == [b"e"]  # the newest kept: the end is not lost behind a 'p'


def test_an_expired_watch_stops_the_pushes(state: RunState, rds: redis.Redis) -> None:
    rid = started(state, 2)
    state.watch(rid, -1)  # a view that went away: its time is over
    commit(state, rid)
    assert wakes(rds, state, rid) == []


def test_watching_a_run_that_is_gone_leaves_no_record(state: RunState, rds: redis.Redis) -> None:
    state.watch("gone", 30)
    assert not rds.exists(state.run_key("gone"))


def test_cancel_pause_and_resume_wake_the_waiter(state: RunState, rds: redis.Redis) -> None:
    rid = started(state, 1)
    state.pause(rid, "maintenance")
    assert state.next_wake(rid, 1.0) == b"p"
    state.resume(rid, state.kids_key(rid, "client-resume-t"))
    assert state.next_wake(rid, 1.0) == b"p"
    state.cancel(rid, "enough")  # one task still out: cancelling, not ended
    assert state.next_wake(rid, 1.0) == b"p"
    idle = started(state, 0)
    state.cancel(idle, "nothing out")  # nothing outstanding: cancelled at once
    assert state.next_wake(idle, 1.0) == b"e"


def test_the_outbox_wakes_a_storing_run_and_ends_it_with_its_last_item(
    state: RunState, rds: redis.Redis, key_prefix: str, tmp_path
) -> None:
    rid = started(state, 1)
    commit(state, rid, n_items=2)  # its tasks are done; its items wait in the outbox
    assert state.next_wake(rid, 1.0) == b"e"
    assert state.status(rid) == "storing"
    d = Drainer(rds, key_prefix, [JsonlSink(tmp_path / "items", fsync=False)])
    for n, woken in ((0, b"p"), (1, b"e")):  # one of two stored: it moved; then it ended
        xadd_entry(rds, key_prefix, "t.item", ["a"], [{"a": n}], run=rid, step="s", task="t.x")
        assert d.drain_once() == 1
        assert state.next_wake(rid, 1.0) == woken
    assert state.status(rid) == "done"
