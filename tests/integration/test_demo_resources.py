"""Cookies, devices, user agents and signatures end to end: real workers, a real Redis, the demo
platform with `login`, `device`, `sign` and `ua_check` on and low ban thresholds.

The demo business chains start with EMPTY cookie and device pools. Tasks that need a session
or a device wait (re-queued, not holding a worker slot) while the production chains
(`demo_cookie_production`, `demo_device_production`, on the `resources` queue) log in and
register; sessions and devices the site bans are detected from its answers, retired and
replaced, and every run still stores 100 % of the site's users, posts and comments.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

import chains
from config import get_settings
from demo.testing import DemoServer
from external_interface.resources.pool import Pool, pool_stats
from external_interface.storage.sinks.jsonl import iter_records
from monitor.deadletter import DeadLetterStore
from monitor.health import collect
from monitor.metrics import read, site_key
from utils.redis import get_redis
from worker import app

pytestmark = pytest.mark.integration

SESSION_BAN_RPM = 8  # the 9th comment read of a session within a minute bans it
DEVICE_BAN_RPM = 15  # app.detail alone makes 100 device requests over at most 4 devices

DEMO: dict[str, Any] = dict(
    size="small",
    features=["login", "device", "sign", "ua_check"],
    session_ban_rpm=SESSION_BAN_RPM,
    device_ban_rpm=DEVICE_BAN_RPM,
)

WORKER_ENV = {
    "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.testsite",
    "CHAINCRAWL_POOL_COOKIE_DEMO": '{"low_water": 3, "target": 6, "produce_gap": 0.5}',
    "CHAINCRAWL_POOL_DEVICE_ID_DEMO": '{"low_water": 2, "target": 4, "produce_gap": 0.5}',
    # a task meets a banned session with p ~ 1/9; eight bans in a row are not going to happen
    "CHAINCRAWL_MAX_RETRIES": "8",
}


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoServer]:
    with DemoServer(**DEMO) as server:
        yield server


@pytest.fixture(scope="module")
def flaky_demo() -> Iterator[DemoServer]:
    """Also `soft_fail`: 5 % of answers are 5xx, cut short or slow (never a pool's fault)."""
    features = [*DEMO["features"], "soft_fail"]
    with DemoServer(
        **{**DEMO, "features": features}, soft_fail_rate=0.05, soft_fail_slow_ms=300
    ) as server:
        yield server


def purge_queues(*names: str) -> None:
    """Drop what earlier tests left in the shared broker: a production run still queued when
    their worker stopped would otherwise log in here and fill the pools this test starts empty."""
    with app.connection_for_write() as conn:
        channel: Any = conn.default_channel  # kombu's channel: its type hint lacks queue_purge
        for name in names:
            channel.queue_purge(name)


def start(start_worker: Any, demo: DemoServer, pool: str = "threads") -> Any:
    demo.reset()
    purge_queues("demo", "resources", "default")
    for kind in ("cookie", "device_id"):
        Pool(kind, "demo").clear()  # start from empty pools
    return start_worker(
        pool=pool, concurrency=16 if pool != "prefork" else 6, queues="demo,resources,default",
        DEMO_BASE_URL=demo.url, **WORKER_ENV,
    )  # fmt: skip


@pytest.fixture
def worker(start_worker: Any, demo: DemoServer) -> Any:
    return start(start_worker, demo)


def stored(run_id: str, item_type: str, key: str) -> list[str]:
    return [r["item"][key] for r in iter_records(item_type) if r["run"] == run_id]


def check_complete(p: chains.runner.Progress, exp: dict[str, Any]) -> None:
    assert p.complete and p.outstanding == 0
    dls = [d for d in DeadLetterStore(get_redis()).list(50) if d.meta.get("run") == p.run_id]
    assert p.totals["failed"] == 0, [(d.task, d.error_type, d.error, d.retries) for d in dls]
    assert p.totals["stored"] == p.totals["items"] == exp["users"] + exp["posts"] + exp["comments"]
    assert sorted(stored(p.run_id, "demo.user", "user_id")) == sorted(
        f"u{i}" for i in range(1, exp["users"] + 1)
    )
    assert sorted(stored(p.run_id, "demo.post", "post_id")) == sorted(
        f"p{i}" for i in range(1, exp["posts"] + 1)
    )
    assert sorted(stored(p.run_id, "demo.comment", "comment_id")) == sorted(
        f"c{i}" for i in range(1, exp["comments"] + 1)
    )


def check_rotation(demo: DemoServer, before: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The site banned sessions and devices; we saw it, retired them and produced more."""
    site = demo.stats()
    rejections = site.get("rejections", {})
    assert rejections.get("bad_sign", 0) == 0, "the signer must always be accepted"
    assert rejections.get("bad_user_agent", 0) == 0, "every front end got a fitting UA"
    assert site["bans"]["session_bans_total"] > 0 and site["bans"]["device_bans_total"] > 0

    r, s = get_redis(), get_settings()
    pools = pool_stats(r, s.key_prefix)
    cookies, devices = pools["cookie:demo"], pools["device_id:demo"]
    # every ban the site issued to a session or device we lent was seen and retired
    assert cookies["bans"] == site["bans"]["session_bans_total"]
    assert devices["bans"] == site["bans"]["device_bans_total"]
    assert cookies["retired_by"].get("banned") == cookies["bans"]
    assert devices["retired_by"].get("banned") == devices["bans"]
    # production made what the run used: one login per session, one registration per device
    assert cookies["produced"] >= cookies["bans"] + 1 and cookies["production_runs"] >= 1
    assert devices["produced"] >= devices["bans"] + 1 and devices["production_runs"] >= 1
    assert site["logins"]["ok"] >= cookies["produced"] - before["logins"]
    assert site["devices"]["registered"] >= devices["produced"]

    m = read(r, site_key("demo", s))
    assert m.get("waited:ResourceUnavailable", 0) > 0  # tasks waited for the empty pools
    assert m.get("retried:LoginRequired", 0) >= cookies["bans"]  # each ban cost one retry
    assert m.get("retried:BannedError", 0) >= devices["bans"]

    print(f"site bans {site['bans']}, logins {site['logins']}, pools {pools}, metrics "
          f"{ {k: v for k, v in m.items() if k.startswith(('waited', 'retried'))} }")  # fmt: skip
    health = {h.name: h for h in collect(r, s)}
    assert health["cookie:demo"].produced == cookies["produced"]
    assert health["device_id:demo"].produced == devices["produced"]
    return pools


def check_no_secrets(worker: Any, demo: DemoServer) -> None:
    """Neither session cookies, device ids nor passwords reach the worker's log."""
    text = worker.text()
    assert "pass-demo" not in text
    for device_id in demo.stats()["devices"]["ids"]:
        assert device_id not in text
    r = get_redis()
    for kind in ("cookie", "device_id"):
        pool = Pool(kind, "demo")
        for raw in r.hvals(pool.k_secret):
            secret = pool.sealer.open(raw)
            values = re.findall(r'"(?:session|device_id)": ?"([^"]+)"', secret)
            assert values
            for value in values:
                assert value not in text and value.encode() not in raw
    assert "logged in as demo" in text  # logins were logged, by account name only


@pytest.mark.parametrize(
    "chain, comments_front",
    [("demo_app", "app.comment"), ("demo_social", "pc.comment")],
)
def test_chain_completes_from_empty_pools_with_bans_rotated(
    worker: Any, demo: DemoServer, chain: str, comments_front: str
) -> None:
    run_and_check(worker, demo, chain, comments_front)


def test_soft_failures_on_top_cost_retries_not_resources(
    start_worker: Any, flaky_demo: DemoServer
) -> None:
    worker = start(start_worker, flaky_demo)
    p = run_and_check(worker, flaky_demo, "demo_social", "pc.comment")
    soft = flaky_demo.stats().get("soft_fail", {})
    assert soft.get("error", 0) + soft.get("truncate", 0) > 0
    assert p.totals["retried"] >= soft.get("error", 0) + soft.get("truncate", 0)


@pytest.mark.parametrize("pool", ["prefork", "gevent"])
def test_other_worker_pools(start_worker: Any, demo: DemoServer, pool: str) -> None:
    """Leases live per process and the production trigger runs inside tasks: both must hold
    in prefork children and under gevent."""
    run_and_check(start(start_worker, demo, pool), demo, "demo_app", "app.comment")


def run_and_check(
    worker: Any, demo: DemoServer, chain: str, comments_front: str
) -> chains.runner.Progress:
    exp = demo.expected()
    before = {"logins": demo.stats()["logins"]["ok"]}
    assert (
        pool_stats(get_redis(), get_settings().key_prefix).get("cookie:demo", {}).get("size", 0)
        == 0
    )
    run = chains.run(chain, seeds=[{}])
    p = run.wait(timeout=240)
    check_complete(p, exp)
    assert p.steps[comments_front]["items"] == exp["comments"]
    check_rotation(demo, before)
    check_no_secrets(worker, demo)
    return p
