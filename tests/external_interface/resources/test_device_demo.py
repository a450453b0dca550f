"""The demo's device registration chain and the device provider against a real DemoServer
with `device`, `sign` and `ua_check` on: a device keeps its UA, bans are detected and retire it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis
import requests

from demo.guards import ua_ok
from demo.testing import DemoServer
from exceptions import BannedError
from external_interface.resources.base import OutgoingRequest
from external_interface.resources.device_id import DeviceProvider
from external_interface.resources.pool import Pool
from sites.production import PoolEntry
from tests.resources_site.helpers import private_env, run_online


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoServer]:
    with DemoServer(
        size="tiny", features=["device", "sign", "ua_check"], device_ban_rpm=3
    ) as server:
        yield server


@pytest.fixture
def env(demo: DemoServer, redis_url: str, key_prefix: str) -> Iterator[None]:
    with private_env(
        CHAINCRAWL_REDIS_URL=redis_url,
        CHAINCRAWL_KEY_PREFIX=key_prefix,
        DEMO_BASE_URL=demo.url,
        CHAINCRAWL_POOL_DEVICE_ID_DEMO='{"low_water": 0}',
    ):
        yield


def produce_device() -> str:
    (ticket,), _ = run_online("demo.device.register", {"slot": 0})  # signed, with the app UA
    (entry,), _ = run_online("demo.device.add", ticket.model_dump())
    assert isinstance(entry, PoolEntry)
    assert entry.pool == "device_id:demo"
    return entry.member


def test_registration_fills_the_pool_with_a_device_and_its_ua(
    env: None, demo: DemoServer, rds: redis.Redis
) -> None:
    member = produce_device()
    pool = Pool("device_id", "demo")
    co = pool.checkout()
    assert co.lease is not None and co.lease.id == member
    device = co.lease.secret
    assert device["device_id"] in demo.stats()["devices"]["ids"]
    assert ua_ok("app", device["user_agent"]) and re.search(r"DemoApp/\d", device["user_agent"])
    pool.cancel(co.lease)
    # the opaque id reveals nothing: the device id is only in the pool's secret hash
    assert device["device_id"] not in member


def test_every_request_of_a_device_carries_its_own_ua(env: None, demo: DemoServer) -> None:
    member = produce_device()
    prov = DeviceProvider("demo", "app")
    seen = set()
    for _ in range(3):
        req = OutgoingRequest("GET", demo.url + "/headers")
        prov.prepare(req, _Task())
        r = requests.get(req.url, headers=req.headers, timeout=5)
        prov.cancel(req)
        echoed = r.json()["headers"]
        seen.add((echoed["User-Agent"], echoed["X-Device-Id"]))
        assert req.leases == {"device_id": member}
    assert len(seen) == 1


def test_app_requests_pass_and_a_device_ban_rotates(
    env: None, demo: DemoServer, rds: redis.Redis
) -> None:
    member = produce_device()
    before = demo.stats()
    for page in (1, 2, 3):  # device_ban_rpm=3
        items, _ = run_online("demo.app.feed", {"page": page, "size": 2})
        assert items
    with pytest.raises(BannedError):
        run_online("demo.app.feed", {"page": 1, "size": 2})
    after = demo.stats()
    assert after["bans"]["device_bans_total"] == before["bans"]["device_bans_total"] + 1
    rejected = after.get("rejections", {})
    assert rejected.get("bad_sign", 0) == before.get("rejections", {}).get("bad_sign", 0)
    assert rejected.get("bad_user_agent", 0) == 0
    pool = Pool("device_id", "demo")
    assert member not in pool
    s = pool.stats()
    assert (s["bans"], s["retired_by"], s["size"]) == (1, {"banned": 1}, 0)


class _Task:
    site, platform, task_name = "demo", "app", "demo.app.feed"

    def __init__(self) -> None:
        self.avoid: set[str] = set()
