"""The cookie and device providers around a request: lending, ban detection with the demo's
rules, retire-on-ban, waiting on an empty pool, production triggers and secrets kept out of logs;
on one Redis and on a Redis Cluster (`[cluster]`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import redis

from demo.responses import LOGIN_WALL
from exceptions import BannedError, LoginRequired, ResourceUnavailable
from external_interface.resources.base import Outcome, OutgoingRequest
from external_interface.resources.cookie import CookieProvider
from external_interface.resources.device_id import DeviceProvider
from external_interface.resources.pool import PoolConfig
from external_interface.resources.user_agent import UserAgentProvider
from sites.demo import production  # noqa: F401 - registers the demo's ban rules and producers
from tests.external_interface.stores import (
    let_time_pass,
    let_ttl_pass,
    rds_on_both_stores,  # noqa: F401 - fixture `rds`
)

SITE = "demo"  # the demo's ban rules are registered for this site name


@dataclass
class Task:
    site: str = SITE
    platform: str = "pc"
    task_name: str = "demo.pc.comments"
    avoid: set[str] = field(default_factory=set)


@dataclass
class Runs:
    """Stands in for chains.run: records production runs; `done` says whether they finished."""

    started: list[tuple[str, list[dict[str, Any]], str]] = field(default_factory=list)
    done: bool = False

    def start(self, chain: Any, seeds: list[dict[str, Any]], rid: str) -> None:
        self.started.append((chain.name, seeds, rid))

    def finished(self, rid: str) -> bool:
        return self.done


def cookies(rds: redis.Redis, prefix: str, runs: Runs | None = None, **cfg: Any) -> CookieProvider:
    runs = runs or Runs()
    cfg.setdefault("low_water", 0)
    return CookieProvider(SITE, "pc", rds=rds, prefix=prefix, config=PoolConfig(**cfg),
                          start=runs.start, finished=runs.finished)  # fmt: skip


def devices(rds: redis.Redis, prefix: str, **cfg: Any) -> DeviceProvider:
    cfg.setdefault("low_water", 0)
    runs = Runs()
    return DeviceProvider(SITE, "app", rds=rds, prefix=prefix, config=PoolConfig(**cfg),
                          start=runs.start, finished=runs.finished)  # fmt: skip


def lend(p: Any, task: Task | None = None) -> OutgoingRequest:
    req = OutgoingRequest("GET", "http://127.0.0.1:1/pc/post/p1/comments")
    p.prepare(req, task or Task())
    return req


def test_prepare_puts_the_cookie_on_the_request_and_only_its_id_in_leases(
    rds: redis.Redis, key_prefix: str
) -> None:
    p = cookies(rds, key_prefix)
    mid = p.pool.add({"cookies": {"session": "s3cr3t-value"}})
    assert mid is not None
    req = lend(p)
    assert req.cookies == {"session": "s3cr3t-value"}
    assert req.leases == {"cookie": mid}
    p.feedback(req, Outcome(0.01, status=200, text_sample="<html>comments</html>"), Task())
    assert p.pool.score(mid) == 6 and p.pool.uses(mid) == 1


@pytest.mark.parametrize(
    "status, body",
    [
        (200, LOGIN_WALL),  # pc: a 200 page with the login form
        (401, '{"error": "login_required", "message": "log in to read comments", "ok": 0}'),
    ],
)
def test_login_wall_bans_the_session_and_asks_to_rotate(
    rds: redis.Redis, key_prefix: str, status: int, body: str
) -> None:
    p = cookies(rds, key_prefix)
    mid = p.pool.add({"cookies": {"session": "x"}})
    assert mid is not None
    task = Task()
    req = lend(p, task)
    with pytest.raises(LoginRequired) as ei:
        p.feedback(req, Outcome(0.01, status=status, text_sample=body[:2048]), task)
    assert mid in str(ei.value) and "x" not in str(ei.value).replace(mid, "")
    assert mid not in p.pool
    assert f"cookie:{mid}" in task.avoid
    s = p.pool.stats()
    assert s["bans"] == 1 and s["retired_by"] == {"banned": 1}


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(0.01, status=403, text_sample='{"error": "banned", "message": "your IP ..."}'),
        Outcome(0.01, status=403, text_sample='{"error": "bad_sign", "code": 403}'),
        Outcome(0.01, status=503, text_sample='{"error": "service_unavailable"}'),
        Outcome(0.01, status=429, text_sample='{"error": "rate_limited"}'),
        Outcome(1.0, error=TimeoutError("read timeout")),
    ],
)
def test_other_failures_are_not_the_sessions_fault(
    rds: redis.Redis, key_prefix: str, outcome: Outcome
) -> None:
    p = cookies(rds, key_prefix)
    mid = p.pool.add({"cookies": {"session": "x"}})
    assert mid is not None
    p.feedback(lend(p), outcome, Task())
    assert mid in p.pool and p.pool.score(mid) == 5 and p.pool.uses(mid) == 1


def test_empty_pool_waits_and_starts_one_production_run(rds: redis.Redis, key_prefix: str) -> None:
    runs = Runs()
    p = cookies(rds, key_prefix, runs, low_water=2, target=5, produce_gap=0.0)
    with pytest.raises(ResourceUnavailable) as ei:
        lend(p)
    assert ei.value.retry_after > 0
    assert len(runs.started) == 1
    name, seeds, rid = runs.started[0]
    assert name == "demo_cookie_production" and len(seeds) == 5
    assert cast(bytes, rds.get(p.pool.k_producing)).decode().split()[0] == rid
    # many other workers asking meanwhile start nothing while that run is going
    for _ in range(5):
        with pytest.raises(ResourceUnavailable):
            lend(cookies(rds, key_prefix, runs, low_water=2, target=5, produce_gap=0.0))
    assert len(runs.started) == 1
    runs.done = True  # the run finished, yet the pool is still low: the next ask starts another
    with pytest.raises(ResourceUnavailable):
        lend(cookies(rds, key_prefix, runs, low_water=2, target=5, produce_gap=0.0))
    assert len(runs.started) == 2
    assert p.pool.stats()["production_runs"] == 2


def test_low_water_starts_production_while_still_lending(rds: redis.Redis, key_prefix: str) -> None:
    runs = Runs()
    p = cookies(rds, key_prefix, runs, low_water=3, target=6)
    p.pool.add({"cookies": {"session": "a"}})
    req = lend(p)
    assert req.cookies == {"session": "a"}
    assert [len(s) for _, s, _ in runs.started] == [5]


def test_a_ban_that_empties_the_pool_starts_production(rds: redis.Redis, key_prefix: str) -> None:
    runs = Runs()
    p = cookies(rds, key_prefix, runs, low_water=1, target=3)
    p.pool.add({"cookies": {"session": "a"}})
    req = lend(p)
    assert runs.started == []
    with pytest.raises(LoginRequired):
        p.feedback(
            req, Outcome(0.01, status=401, text_sample='{"error": "login_required"}'), Task()
        )
    assert [len(s) for _, s, _ in runs.started] == [3]


def test_device_sets_its_id_and_its_own_user_agent(rds: redis.Redis, key_prefix: str) -> None:
    d = devices(rds, key_prefix)
    ua = "DemoApp/3.2.1 (Android 14; Pixel 8)"
    mid = d.pool.add(
        {"device_id": "dev-0123456789abcdef", "user_agent": ua, "header": "X-Device-Id"}
    )
    req = OutgoingRequest("GET", "http://127.0.0.1:1/app/api/feed", headers={"user-agent": "x"})
    d.prepare(req, Task(platform="app"))
    UserAgentProvider(SITE, "app").prepare(req, Task(platform="app"))  # runs after: keeps it
    assert req.headers == {"X-Device-Id": "dev-0123456789abcdef", "User-Agent": ua}
    assert req.leases == {"device_id": mid}


@pytest.mark.parametrize("code", ["device_banned", "unknown_device"])
def test_device_ban_retires_the_device(rds: redis.Redis, key_prefix: str, code: str) -> None:
    d = devices(rds, key_prefix)
    mid = d.pool.add({"device_id": "dev-1", "user_agent": "DemoApp/1 (a; b)"})
    task = Task(platform="app")
    req = OutgoingRequest("GET", "http://127.0.0.1:1/app/api/feed")
    d.prepare(req, task)
    with pytest.raises(BannedError) as ei:
        d.feedback(req, Outcome(0.01, status=403, text_sample=f'{{"error": "{code}"}}'), task)
    assert not isinstance(ei.value, LoginRequired)
    assert mid not in d.pool and f"device_id:{mid}" in task.avoid


def test_device_is_not_blamed_for_the_login_wall(rds: redis.Redis, key_prefix: str) -> None:
    d = devices(rds, key_prefix)
    mid = d.pool.add({"device_id": "dev-1"})
    req = OutgoingRequest("GET", "http://127.0.0.1:1/app/api/comments")
    d.prepare(req, Task(platform="app"))
    d.feedback(req, Outcome(0.01, status=401, text_sample='{"error": "login_required"}'), Task())
    assert mid in d.pool


def test_waiting_for_a_cookie_gives_the_device_back(rds: redis.Redis, key_prefix: str) -> None:
    d = devices(rds, key_prefix, cooldown=60)
    c = cookies(rds, key_prefix)
    mid = d.pool.add({"device_id": "dev-1"})
    assert mid is not None
    req = OutgoingRequest("GET", "http://127.0.0.1:1/app/api/comments")
    task = Task(platform="app")
    d.prepare(req, task)  # PROVIDER_ORDER: device_id before cookie
    with pytest.raises(ResourceUnavailable):
        c.prepare(req, task)
    assert "device_id" not in req.leases
    s = d.pool.stats()
    assert s["available"] == 1 and s["cancelled"] == 1 and d.pool.uses(mid) == 0


def test_avoid_from_an_earlier_attempt_is_respected(rds: redis.Redis, key_prefix: str) -> None:
    p = cookies(rds, key_prefix)
    a = p.pool.add({"cookies": {"session": "a"}})
    b = p.pool.add({"cookies": {"session": "b"}})
    task = Task(avoid={f"cookie:{a}", "proxy:1.2.3.4:80"})
    for _ in range(3):
        req = lend(p, task)
        assert req.leases["cookie"] == b
        p.feedback(req, Outcome(0.01, status=200), task)


def test_secrets_never_reach_the_logs(
    rds: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    c = cookies(rds, key_prefix, low_water=5, target=6)
    d = devices(rds, key_prefix)
    c.pool.add({"cookies": {"session": "SESSION-SECRET-1"}})
    d.pool.add({"device_id": "DEVICE-SECRET-1", "user_agent": "DemoApp/1 (x; y)"})
    task = Task(platform="app")
    req = OutgoingRequest("GET", "http://127.0.0.1:1/app/api/comments")
    d.prepare(req, task)
    c.prepare(req, task)
    errors = []
    for p, body in ((c, '{"error": "login_required"}'), (d, '{"error": "device_banned"}')):
        with pytest.raises(BannedError) as ei:
            p.feedback(req, Outcome(0.01, status=401 if p is c else 403, text_sample=body), task)
        errors.append(str(ei.value))
    text = caplog.text + " ".join(errors) + repr(req.leases) + repr(task.avoid)
    assert "SESSION-SECRET" not in text and "DEVICE-SECRET" not in text
    assert "banned" in caplog.text  # the bans were logged, by id


def test_lease_ttl_returns_a_lease_whose_feedback_never_came(
    rds: redis.Redis, key_prefix: str
) -> None:
    p = cookies(rds, key_prefix, lease_ttl=60)
    p.pool.add({"cookies": {"session": "a"}})
    lend(p)  # the worker died before feedback
    let_time_pass(rds, p.pool, 61)
    assert lend(p).cookies == {"session": "a"}


def test_production_runs_that_add_nothing_back_off(rds: redis.Redis, key_prefix: str) -> None:
    runs = Runs(done=True)  # every run finishes at once, adding nothing (e.g. accounts refused)
    pool = cookies(rds, key_prefix, runs, low_water=2, target=2, produce_gap=10).pool

    def later(seconds: float) -> None:  # the gap between runs is a key with a TTL
        let_ttl_pass(rds, pool.k_gap, seconds)

    assert pool.try_start_production(2, runs.start, runs.finished)  # first run
    assert pool.try_start_production(2, runs.start, runs.finished) is None  # within the gap
    later(11)
    assert pool.try_start_production(2, runs.start, runs.finished)  # dry 1: next after 20 s
    later(11)
    assert pool.try_start_production(2, runs.start, runs.finished) is None
    later(10)
    assert pool.try_start_production(2, runs.start, runs.finished)  # dry 2: next after 40 s
    later(21)
    assert pool.try_start_production(2, runs.start, runs.finished) is None
    pool.add({"cookies": {"session": "x"}})  # a run that adds something ends the streak
    later(20)
    assert pool.try_start_production(2, runs.start, runs.finished)
    s = pool.stats()
    assert (s["production_runs"], s["production_dry_runs"]) == (4, 2)
    assert not rds.exists(f"{pool.base}:dry_streak")
