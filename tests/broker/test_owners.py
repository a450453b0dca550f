"""broker.owners.serving_for: how long the broker's Redis has served, so that owners
are not declared dead while their heartbeats cannot have come back yet."""

from __future__ import annotations

from typing import Any, cast

import redis

from broker import owners
from utils import process


class FakeInfo:
    def __init__(self) -> None:
        self.info_ = {"run_id": "a", "uptime_in_seconds": 0, "loading": 0}

    def info(self) -> dict[str, Any]:
        return dict(self.info_)


def test_seconds_spent_loading_do_not_count_as_serving() -> None:
    r, now = FakeInfo(), [100.0]
    clock = lambda: now[0]  # noqa: E731
    client = cast(redis.Redis, r)  # a fake with the one method serving_for calls
    r.info_.update(run_id="restarted-1", uptime_in_seconds=8, loading=1)
    assert owners.serving_for(client, clock) == 0.0  # loading: nobody can beat yet
    r.info_["loading"] = 0  # done loading after 8 s of uptime
    assert owners.serving_for(client, clock) == 0.0  # first seen serving now, not 8 s ago
    now[0] += 2.5
    assert owners.serving_for(client, clock) == 2.5
    r.info_.update(run_id="restarted-2", uptime_in_seconds=1)  # another restart
    assert owners.serving_for(client, clock) == 0.0
    now[0] += 5
    r.info_["uptime_in_seconds"] = 2  # a process that saw it late: its uptime is the bound
    assert owners.serving_for(client, clock) == 2.0


def test_the_heartbeat_registers_the_owner_again_after_a_flush_not_every_beat(
    rds: redis.Redis, key_prefix: str
) -> None:
    """The first beat adds the owner to `owners`; the next beats only refresh the heartbeat
    key (one command), until a beat finds the key gone (the broker's Redis restarted empty or
    was flushed): that beat adds the owner again. Every REGISTER_EVERY beats it is re-added
    anyway."""
    prefix = f"{key_prefix}:q:"
    beat = owners.Heartbeat(rds, prefix, "w1", ttl=60)
    beat.beat()
    assert owners.registered(rds, prefix) == {"w1"}
    rds.srem(f"{prefix}{owners.OWNERS}", "w1")  # to see that the next beats do not add it
    for _ in range(owners.REGISTER_EVERY - 1):
        beat.beat()
    assert owners.registered(rds, prefix) == set()
    beat.beat()  # the REGISTER_EVERY-th beat after the first
    assert owners.registered(rds, prefix) == {"w1"}
    for key in rds.scan_iter(match=f"{prefix}*"):  # a flush of the broker's keys
        rds.delete(key)
    beat.beat()
    assert owners.registered(rds, prefix) == {"w1"}
    assert rds.pttl(f"{prefix}{owners.ALIVE}w1") > 0
    beat.leave()
    rds.delete(f"{prefix}{owners.ALIVE}w1")
    beat.beat()  # a clean shutdown's last beats never register it again
    assert owners.registered(rds, prefix) == set()


def test_an_idle_workers_heartbeat_beats_every_half_ttl_and_keeps_its_ttl(
    rds: redis.Redis, key_prefix: str
) -> None:
    """No task started since the last beat and no message held: the next beat comes after
    half the TTL, not a fifth; the key keeps the whole TTL, so a dead worker's heartbeat is
    gone as soon after its last beat as before. A task started or a message held: a fifth."""
    prefix = f"{key_prefix}:q:"
    beat = owners.Heartbeat(rds, prefix, "w1", ttl=20)
    beat.beat()
    assert 10_000 < rds.pttl(f"{prefix}{owners.ALIVE}w1") <= 20_000
    assert beat.next_wait() == 10
    process.note_work()
    assert beat.next_wait() == 4
    assert beat.next_wait() == 10
    owners._held.add("tag-1")  # what the tagging patch notes as kombu records a message
    try:
        assert beat.next_wait() == 4
    finally:
        owners._held.discard("tag-1")
    assert beat.next_wait() == 10
