"""The registry of live workers' task sets, and the task ids workers refused as unknown."""

from __future__ import annotations

import time

import pytest
import redis

from broker.workers import Beat, TaskSets
from config import Settings
from exceptions import WorkersOutdated


@pytest.fixture
def sets(rds: redis.Redis, redis_url: str, key_prefix: str) -> TaskSets:
    return TaskSets(rds, Settings(redis_url=redis_url, key_prefix=key_prefix))


def test_a_published_set_is_live_until_it_is_not_refreshed(sets: TaskSets) -> None:
    sets.publish("w1@a", ["s.a", "s.b"], ["s"])
    sets.publish("w2@b", ["s.a"], [], live_for=0.05)  # its beats stop: gone by the server's clock
    time.sleep(0.2)
    live = sets.live()
    assert list(live) == ["w1@a"]
    assert live["w1@a"].tasks == {"s.a", "s.b"} and live["w1@a"].consumes("s")
    assert not live["w1@a"].consumes("other")
    sets.r.hset(sets.key, "w3@c", b'{"tasks": [], "queues": [], "at": 1.0}')  # long gone
    sets.live()
    assert sorted(sets.r.hkeys(sets.key)) == [b"w1@a", b"w2@b"]  # only that entry is dropped
    sets.publish("w2@b", ["s.a"], [])  # beating again: live again
    assert list(sets.live()) == ["w1@a", "w2@b"]
    sets.leave("w1@a")
    assert list(sets.live()) == ["w2@b"]


def test_check_refuses_naming_the_missing_tasks_and_workers(sets: TaskSets) -> None:
    sets.publish("w1@a", ["s.a"], ["s"])
    sets.publish("w2@b", ["s.a", "s.new"], ["s"])
    sets.publish("w3@c", ["r.x"], ["resources"])  # does not consume `s`: not concerned
    check = sets.check({"s.a": "s", "s.new": "s"})
    assert check.missing == {"w1@a": ["s.new"]} and not check.note
    with pytest.raises(WorkersOutdated) as err:
        check.raise_if_outdated()
    assert err.value.tasks == ["s.new"] and err.value.workers == ["w1@a"]
    assert "s.new" in str(err.value) and "w1@a" in str(err.value)
    assert "restart the workers" in str(err.value)


def test_check_passes_when_every_consumer_knows_the_tasks(sets: TaskSets) -> None:
    sets.publish("w1@a", ["s.a", "s.b"], [])  # no queues said: every queue
    check = sets.check({"s.a": "s", "s.b": "s"})
    check.raise_if_outdated()
    assert check.live == ["w1@a"] and not check.missing and not check.note


def test_check_only_warns_without_live_workers_or_consumers(sets: TaskSets) -> None:
    check = sets.check({"s.a": "s"})
    assert check.live == [] and "no worker is up" in check.note
    check.raise_if_outdated()
    sets.publish("w1@a", ["s.a"], ["other"])
    check = sets.check({"s.a": "s"})
    assert not check.missing and "s (s.a)" in check.note


def test_unknown_task_ids_are_marked_and_counted(sets: TaskSets) -> None:
    assert sets.unknown(["t1", "t2"]) == set() and sets.unknown([]) == set()
    sets.mark_unknown(["t1", ""])
    sets.mark_unknown(["t3"])
    assert sets.unknown(["t1", "t2", "t3"]) == {"t1", "t3"}
    assert sets.unknown_total() == 2


def test_a_beat_publishes_at_start_and_leaves_at_stop(sets: TaskSets) -> None:
    beat = Beat(sets, "w9@x", ["s.b", "s.a", "s.a"], ["s"])
    beat.start()
    try:
        assert sets.live()["w9@x"].tasks == {"s.a", "s.b"}
    finally:
        beat.stop()
    assert sets.live() == {}


def test_a_beat_refreshes_the_key_and_publishes_again_once_it_was_gone(sets: TaskSets) -> None:
    """Between publications a beat only refreshes the `alive` key; one that finds the key
    gone (a flush, a restart of an empty Redis) says so, and the beat publishes again."""
    sets.publish("w8@x", ["s.a"], ["s"])
    assert sets.refresh("w8@x") is True
    sets.r.delete(sets.key, sets.alive_key("w8@x"))  # flushed
    assert sets.refresh("w8@x") is False
    assert "w8@x" not in sets.live()  # the key alone names no tasks: publish again
    sets.publish("w8@x", ["s.a"], ["s"])
    assert sets.live()["w8@x"].tasks == {"s.a"}


def test_a_beat_says_when_and_where_its_worker_loaded_its_code(sets: TaskSets) -> None:
    """`trigger` compares a site's files with it (cli/runs.py stale_code)."""
    import socket

    before = time.time()
    beat = Beat(sets, "w7@x", ["s.a"], ["s"])
    beat.start()
    try:
        w = sets.live()["w7@x"]
        assert before <= w.started <= time.time() and w.host == socket.gethostname()
    finally:
        beat.stop()
    sets.publish("w6@old", ["s.a"], ["s"])  # a worker that does not say: 0, never stale
    assert sets.live()["w6@old"].started == 0.0
