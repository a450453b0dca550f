"""The adaptive throttle against a real Redis, in this process: AutoThrottle's rule, backoff
and Retry-After, the state every worker shares, and one round trip per request with the gate;
on one Redis and on a Redis Cluster (`new_client`), except the round-trip count."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from config import Settings
from exceptions import Throttled
from scheduling.gate import RedisGate
from scheduling.limits import parse_limits
from scheduling.throttle import Throttle


class CountingRedis(redis.Redis):
    """Counts round trips: single commands and pipeline executions."""

    trips = 0

    def execute_command(self, *args: Any, **kw: Any) -> Any:
        CountingRedis.trips += 1
        return super().execute_command(*args, **kw)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        run = pipe.execute

        def execute(raise_on_error: bool = True) -> Any:
            CountingRedis.trips += 1
            return run(raise_on_error)

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


@pytest.fixture
def settings_for(redis_url: str, key_prefix: str):
    def make(**kw: Any) -> Settings:
        base = {"throttle": True, "throttle_start_delay": 0.2, "throttle_target_concurrency": 1.0}
        return Settings(redis_url=redis_url, key_prefix=key_prefix, **{**base, **kw})

    return make


@pytest.fixture
def make_throttle(new_client, settings_for):
    """make_throttle(max_sleep, **settings): a throttle with a client of its own."""

    def make(max_sleep: float = 2.0, **kw: Any) -> Throttle:
        return Throttle(new_client(), settings_for(**kw), max_sleep=max_sleep)

    return make


def test_the_start_delay_spaces_requests_of_every_worker(make_throttle) -> None:
    """Two throttles (two workers), no latency measured yet: one request per start delay."""
    workers = [make_throttle(), make_throttle()]
    t0 = time.monotonic()
    for i in range(5):
        workers[i % 2].wait("s")
    elapsed = time.monotonic() - t0
    # four gaps of 0.2 s at least, shared by both (one each would be two gaps); the upper
    # bound only says the throttle did not wait for seconds (a loaded machine adds its own)
    assert 0.75 <= elapsed < 5, elapsed


def test_latency_sets_the_delay_for_the_target_concurrency(make_throttle) -> None:
    t = make_throttle(throttle_start_delay=1.0, throttle_target_concurrency=2.0)
    t.delay("s")
    for _ in range(10):
        t.feedback("s", 0.1, 200)
    assert t.state("s")["delay"] == 1.0  # buffered: nothing sent yet
    t.flush("s")
    state = t.state("s")
    assert state["delay"] == pytest.approx(0.05, abs=0.002)  # latency / 2, after 10 halvings
    assert state["latency"] == pytest.approx(0.1, abs=0.001) and state["samples"] == 10
    t.feedback("s", 3.0, 200)  # a slower answer raises the delay at once, not halfway
    t.flush()
    assert t.state("s")["delay"] == pytest.approx(1.5, abs=0.001)


def test_other_answers_never_lower_the_delay(make_throttle) -> None:
    t = make_throttle(throttle_start_delay=1.0)
    for status in (404, 301, 500, 0):
        t.feedback("s", 0.01, status)
    t.flush()
    assert t.state("s")["delay"] == 1.0  # fast error pages do not speed a site up
    t.feedback("s", 3.0, 0)  # a slow timeout does slow it down
    t.flush()
    assert t.state("s")["delay"] == pytest.approx(3.0, abs=0.001)


def test_the_delay_stays_below_its_maximum(make_throttle) -> None:
    t = make_throttle(throttle_max_delay=0.5)
    t.feedback("s", 10.0, 200)
    t.flush()
    assert t.state("s")["delay"] == 0.5


def test_429_doubles_once_per_burst(make_throttle) -> None:
    t = make_throttle(throttle_start_delay=0.05)
    t.feedback("s", 0.1, 200)
    t.flush()
    assert t.state("s")["delay"] == pytest.approx(0.1, abs=0.001)
    for _ in range(8):  # the answers to eight requests that were in flight together
        t.feedback("s", 0.1, 429)
    state = t.state("s")
    assert state["delay"] == pytest.approx(0.2, abs=0.001) and state["backoffs"] == 1
    time.sleep(0.25)  # a new 429 after a whole delay: the site still objects
    t.feedback("s", 0.1, 503)
    state = t.state("s")
    assert state["delay"] == pytest.approx(0.4, abs=0.001) and state["backoffs"] == 2


def test_a_backoff_leaves_a_floor_that_halves_every_32_answers(make_throttle) -> None:
    """After a 429 the latency rule alone would return to the speed that caused it at once;
    the floor keeps the backed-off delay and lets it go slowly."""
    t = make_throttle(throttle_start_delay=0.05)
    t.feedback("s", 0.01, 429)
    assert t.state("s")["delay"] == pytest.approx(0.1, abs=0.001)  # at least 100 ms
    for _ in range(8):
        t.feedback("s", 0.01, 200)  # fast answers: latency alone says 10 ms
    t.flush()
    assert t.state("s")["delay"] == pytest.approx(0.1 * 0.5 ** (8 / 32), abs=0.001)
    for _ in range(24):
        t.feedback("s", 0.01, 200)
    t.flush()
    assert t.state("s")["delay"] == pytest.approx(0.05, abs=0.001)


def test_retry_after_pauses_the_site_for_every_worker(make_throttle) -> None:
    a, b = make_throttle(max_sleep=1.0), make_throttle(max_sleep=1.0)
    a.feedback("s", 0.1, 429, retry_after=3.0)
    assert 2.9 <= b.state("s")["paused_for"] <= 3.0
    with pytest.raises(Throttled) as err:
        b.delay("s")  # the pause is longer than max_sleep: give the worker slot back
    assert 2.0 <= err.value.retry_after <= 3.3
    capped = make_throttle(throttle_max_retry_after=2.0)
    capped.feedback("other", 0.1, 503, retry_after=3600)
    assert 1.9 <= capped.state("other")["paused_for"] <= 2.0


def test_a_refused_slot_reserves_nothing(make_throttle) -> None:
    t = make_throttle(max_sleep=0.5, throttle_start_delay=2.0)
    assert t.delay("s") == 0.0
    waits = []
    for _ in range(2):
        with pytest.raises(Throttled) as err:
            t.delay("s")
        waits.append(err.value.retry_after)
    assert all(1.5 <= w <= 2.0 * 1.3 for w in waits), waits  # the second saw no new booking


def test_usage_state_and_the_setting(make_throttle, settings_for) -> None:
    t = make_throttle()
    assert t.state("nobody") is None
    t.delay("b-site")
    t.delay("a-site")
    rows = t.usage()
    assert [r["site"] for r in rows] == ["a-site", "b-site"]
    assert rows[0]["delay"] == 0.2 and rows[0]["backoffs"] == 0
    t.r.delete(t.key("b-site"))  # expired after its idle time
    assert [r["site"] for r in t.usage()] == ["a-site"]
    assert Throttle.from_settings(t.r, settings_for(throttle=False)) is None
    assert isinstance(Throttle.from_settings(t.r, settings_for()), Throttle)


def test_the_gate_takes_tokens_and_the_throttle_slot_in_one_round_trip(
    redis_url: str, settings_for
) -> None:
    client = CountingRedis.from_url(redis_url)
    s = settings_for(throttle_start_delay=0.0)
    throttle = Throttle(client, s, max_sleep=1.0)
    gate = RedisGate(parse_limits("s=100000/s"), settings=s, client=client, throttle=throttle)
    gate.before_request("s", "s.p.e")  # loads the scripts
    gate.before_request("other", "other.p.e")  # no limit of its own: the throttle only
    n = 50
    CountingRedis.trips = 0
    t0 = time.perf_counter()
    for _ in range(n):
        gate.before_request("s", "s.p.e")
        throttle.feedback("s", 0.0, 200)  # no latency: no delay, so only the cost is timed
    per_request = (time.perf_counter() - t0) / n
    assert CountingRedis.trips == n  # tokens, throttle slot and feedback: one round trip
    CountingRedis.trips = 0
    for _ in range(n):
        gate.before_request("other", "other.p.e")
    assert CountingRedis.trips == n
    CountingRedis.trips = 0
    throttle.feedback("s", 0.01, 429)
    assert CountingRedis.trips == 1  # a backoff is sent at once
    print(f"\ngate tokens + throttle slot + feedback: {per_request * 1e6:.0f} us per request")
    state = throttle.state("s")
    assert state is not None and state["samples"] >= n - 1
    client.close()


@pytest.fixture
def throttled_gate(new_client, settings_for):
    """throttled_gate(limits, start_delay): a redis gate with a throttle, as a worker has."""

    def make(limits: str, start_delay: float) -> RedisGate:
        client = new_client()
        s = settings_for(throttle_start_delay=start_delay)
        throttle = Throttle(client, s, max_sleep=1.0)
        return RedisGate(parse_limits(limits), settings=s, client=client, throttle=throttle)

    return make


def test_the_gate_waits_for_the_later_of_both_slots(throttled_gate) -> None:
    gate = throttled_gate("s=100/s", 0.1)
    t0 = time.monotonic()
    for _ in range(6):
        gate.before_request("s", "s.p.e")
    assert 0.45 <= time.monotonic() - t0 < 5  # five throttle gaps, not five token gaps


def test_scripts_come_back_after_a_flush(throttled_gate) -> None:
    gate = throttled_gate("s=1000/s", 0.0)
    gate.before_request("s", "s.p.e")
    gate.r.script_flush()  # a restarted Redis forgets its scripts
    gate.before_request("s", "s.p.e")
    assert gate.throttle is not None and gate.throttle.state("s") is not None


def test_a_backoff_is_heard_by_another_workers_gate(throttled_gate) -> None:
    """A 429 with Retry-After answered to one worker pauses the site for every worker's gate:
    the other gate's next request (tokens and throttle slot in one round trip) is re-queued;
    the sites show in the report, each once."""
    a, b = throttled_gate("s=100/s; s.p.e=50/s", 0.0), throttled_gate("s=100/s; s.p.e=50/s", 0.0)
    a.before_request("s", "s.p.e")
    a.feedback("s", 0.1, 429, 60.0)
    with pytest.raises(Throttled) as err:
        b.before_request("s", "s.p.e")
    assert err.value.retry_after > 30  # the pause: a minute
    assert b.throttle is not None
    b.throttle.feedback("t", 0.1, 200)
    b.throttle.flush("t")  # a site first seen through feedback alone
    rows = b.throttle.usage()
    assert [r["site"] for r in rows] == ["s", "t"]
    assert rows[0]["backoffs"] == 1 and rows[0]["paused_for"] > 30
