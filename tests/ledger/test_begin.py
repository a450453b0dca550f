"""A begin reads only what it cannot know: a first delivery looks up no done set (its commit
still refuses a second commit), a run's hold the caller read lately is not read again, and
every commit's reply says the run's hold for the next begins."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import ledger.state
from config import Settings
from ledger.state import Kid, RunState
from utils.lua import script


@pytest.fixture
def state(rds: redis.Redis, redis_url: str, key_prefix: str) -> RunState:
    rds.script_load(script(ledger.state.__file__, "commit.lua"))
    return RunState(rds, Settings(redis_url=redis_url, key_prefix=key_prefix))


def calls(rds: redis.Redis) -> dict[str, int]:
    """Commands run since the last reset, by name (INFO and CONFIG left out)."""
    return {
        k.removeprefix("cmdstat_"): int(v["calls"])
        for k, v in rds.info("commandstats").items()
        if k not in ("cmdstat_info", "cmdstat_config")
    }


def commit(state: RunState, tid: str, kids: tuple[Kid, ...] = ()) -> Any:
    return state.commit(rid="r1", tid=tid, step="s", outcome="succeeded", kids=kids)


def test_a_first_delivery_looks_up_no_done_set_and_its_commit_is_refused(
    state: RunState, rds: redis.Redis
) -> None:
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 1)
    assert commit(state, "a") is not None
    rds.config_resetstat()
    b = state.begin("r1", "a", 0, redelivered=False)
    assert not b.committed and b.deliveries == 1  # not looked up: taken as not committed
    assert "smismember" not in calls(rds)
    assert commit(state, "a") is None  # the commit refuses it: counted once
    assert state.counters("r1")["succeeded"] == 1
    assert state.begin("r1", "a", 0, redelivered=True).committed  # a redelivery looks
    assert state.begin("r1", "a", 0).committed  # no flag to go by: looks


def test_a_hold_the_caller_knows_is_not_read_and_a_batch_begin_may_send_nothing(
    state: RunState, rds: redis.Redis
) -> None:
    state.create_run("r1", "c", b"{}", 5)
    state.cancel("r1", "test")
    rds.config_resetstat()
    assert not state.begin("r1", "a", 0, redelivered=False, hold="").cancelled
    assert state.begin("r1", "a", 0, redelivered=False, hold="paused").paused
    assert calls(rds) == {}  # nothing sent at all
    assert state.begin("r1", "a", 0, redelivered=False).cancelled  # not known: read
    rds.config_resetstat()
    begun, n = state.begin_many(
        [("r1", "a", 0), ("r1", "b", 0)], batch_id="b1", redelivered=False, known={"r1": ""}
    )
    assert n == 1 and [b.cancelled for b in begun] == [False, False]
    assert calls(rds) == {}


def test_every_commit_says_the_runs_hold(state: RunState) -> None:
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 3)
    assert commit(state, "a").hold == ""
    state.pause("r1")
    assert commit(state, "b").hold == "paused"
    state.cancel("r1")
    assert commit(state, "c").hold == "cancelled"
