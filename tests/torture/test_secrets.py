"""Secrets stay secret: a demo crawl with known secrets, then every place they must not be is
searched for them.

The whole chain runs against a private Redis with `requirepass` (`redis://:<pw>@...`), every
demo request goes through forward proxies that require Basic credentials
(`http://user:<pw>@127.0.0.x:port`), and the demo site has its `login` and `device` features
on, with accounts whose passwords are known only to the workers' configuration
(`CHAINCRAWL_ACCOUNTS_DEMO`): the cookie production chain logs in (captcha included), the
device chain registers devices, and the sessions and devices they get are lent to the
requests that need them.

Searched for every secret (the Redis password, the proxy password, the account passwords, the
session cookie values and device ids the site handed out, the sealing key):
- every worker log (one worker at INFO, one at DEBUG);
- every message in the broker, sampled every 0.1 s through the run (queues and `unacked`),
  with the base64 bodies decoded: the task arguments;
- every Celery event published during the run (what Flower shows), bodies decoded;
- every Redis key at the end: the places that keep secrets (pool members, proxy URLs, the
  vault) keep them sealed (utils/seal.py), and they open to the real values;
- Redis's files at rest: the append-only file (every write of the run) and an RDB dump taken
  at the end (uncompressed, so a secret would show as plain bytes), both 0600 in a 0700 dir.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis

import chains
from config import get_settings
from demo.proxy_farm import ProxyFarm
from demo.testing import DemoServer
from external_interface.resources.lease import KEY_NAMES
from external_interface.resources.pool import Pool
from external_interface.resources.proxy.models import ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from tests.torture.conftest import report
from tests.torture.harness import scan_values, wait_complete
from utils.seal import MAGIC, get_sealer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

REDIS_PW = "rds-" + secrets.token_hex(8)
PROXY_USER = "crawler"
PROXY_PW = "prx-" + secrets.token_hex(8)
ACCOUNTS = {f"sec{i}": "acct-" + secrets.token_hex(6) for i in range(1, 4)}
# more proxies than worker slots: a task that waits for the first login gives back the proxy
# it had leased (test_crash_paths.py::test_a_proxy_lease_is_returned_when_a_later_provider_refuses)
N_PROXIES = 24


def decode(raw: bytes) -> bytes:
    """A kombu envelope with its base64 body decoded next to it (else the raw bytes)."""
    out = [raw]
    try:
        env = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(env, dict) and isinstance(env.get("body"), str):
        with contextlib.suppress(ValueError):
            out.append(base64.b64decode(env["body"]))
    if isinstance(env, list) and len(env) == 3 and isinstance(env[0], dict):  # unacked entry
        return b"\n".join([raw, decode(json.dumps(env[0]).encode())])
    return b"\n".join(out)


class BrokerTap(threading.Thread):
    """Samples every queued and unacknowledged message, and records every event published."""

    def __init__(self, url: str, prefix: str) -> None:
        super().__init__(name="broker-tap", daemon=True)
        self.r = redis.Redis.from_url(url)
        self.prefix = prefix
        self.messages: dict[int, bytes] = {}
        self.events: list[bytes] = []
        self.sessions: set[str] = set()  # session cookies seen in the pool, to search for
        self.devices: set[str] = set()  # device ids seen in the pool
        self.stop_event = threading.Event()

    def run(self) -> None:
        ps = self.r.pubsub(ignore_subscribe_messages=True)
        ps.psubscribe(f"{self.prefix}:q:*")
        cookies, devices = Pool("cookie", "demo"), Pool("device_id", "demo")
        while not self.stop_event.is_set():
            for key in self.r.scan_iter(match=f"{self.prefix}:q:*", count=500):
                kind = self.r.type(key)
                values = cast("list[bytes]", (
                    self.r.lrange(key, 0, -1) if kind == b"list"
                    else self.r.hvals(key) if kind == b"hash" else []
                ))  # fmt: skip
                for v in values:
                    self.messages.setdefault(hash(v), decode(v))
            for v in self.secrets(cookies):  # sealed: opened with the workers' key
                jar = json.loads(cookies.sealer.open(v)).get("cookies", {})
                self.sessions.update(str(c) for c in jar.values())
            for v in self.secrets(devices):
                self.devices.add(str(json.loads(devices.sealer.open(v))["device_id"]))
            deadline = time.monotonic() + 0.1
            while (m := ps.get_message(timeout=max(0.0, deadline - time.monotonic()))) is not None:
                if isinstance(m.get("data"), bytes):
                    self.events.append(decode(m["data"]))

    def secrets(self, pool: Pool) -> list[bytes]:
        """The sealed secrets of every sub-pool of `pool` (a member lives in one of them)."""
        at = KEY_NAMES.index("secret")
        return [v for keys in pool.part_keys for v in cast("list[bytes]", self.r.hvals(keys[at]))]

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)


@pytest.fixture
def proxies() -> Iterator[list[Any]]:
    farm = ProxyFarm().start()
    try:
        yield [farm.add_proxy(auth=(PROXY_USER, PROXY_PW)) for _ in range(N_PROXIES)]
    finally:
        farm.stop()


def test_secrets_never_reach_logs_messages_or_events(
    torture_factory: Any, fleets: Any, proxies: list[Any], request: pytest.FixtureRequest
) -> None:
    with DemoServer(size="tiny", features=["login", "device"], accounts=ACCOUNTS) as demo:
        t = torture_factory(
            password=REDIS_PW,
            DEMO_BASE_URL=demo.url,
            CHAINCRAWL_EXTRA_SITE_PACKAGES="tests.testsite,tests.torture.site",
            CHAINCRAWL_PROVIDERS="user_agent=noop,sign=noop",
            CHAINCRAWL_ACCOUNTS_DEMO=",".join(f"{u}:{p}" for u, p in ACCOUNTS.items()),
            CHAINCRAWL_POOL_COOKIE_DEMO='{"low_water": 2, "target": 3, "produce_gap": 0.5}',
            CHAINCRAWL_POOL_DEVICE_ID_DEMO='{"low_water": 2, "target": 3, "produce_gap": 0.5}',
            CHAINCRAWL_PROXY_SITES="demo",
            CHAINCRAWL_MAX_RETRIES="8",
            CHAINCRAWL_TASK_EVENTS="1",  # off by default: what Flower would show must be checked
            CHAINCRAWL_TASK_LOG="1",  # the per-task log lines too
        )
        url = t.env["CHAINCRAWL_REDIS_URL"]
        assert REDIS_PW in url
        with pytest.raises(redis.AuthenticationError):  # the password is really required
            redis.Redis(port=t.redis.port).ping()
        pool = GlobalPool()
        for p in proxies:
            pool.admit(ProxyAddress.parse(p.url), elapsed=0.01)
        queues = "demo,resources,default"
        fleets(t, tag="info", queues=queues, concurrency=4).start(1)
        fleets(t, tag="debug", queues=queues, concurrency=4, loglevel="DEBUG").start(1)
        tap = BrokerTap(url, t.prefix)
        tap.start()
        try:
            run = chains.run("demo_social", seeds=[{}])
            p = wait_complete(run, timeout=300)
            time.sleep(1)
        finally:
            tap.stop()
        exp = demo.expected()
        site = demo.stats()

        # the secrets were really in play
        assert p.totals["failed"] == 0
        assert p.totals["stored"] == exp["users"] + exp["posts"] + exp["comments"]
        assert site["logins"]["ok"] >= 1 and tap.sessions
        issued_devices = set(site["devices"]["ids"])
        assert issued_devices and tap.devices <= issued_devices
        assert sum(px.requests for px in proxies) >= p.totals["succeeded"]
        assert all(px.rejected_auth == 0 for px in proxies)

        found: dict[str, list[str]] = {}
        targets = {
            "redis password": REDIS_PW,
            "proxy password": PROXY_PW,
            "proxy credentials": f"{PROXY_USER}:{PROXY_PW}",
            **{f"password of {u}": pw for u, pw in ACCOUNTS.items()},
            **{f"session cookie {i}": s for i, s in enumerate(sorted(tap.sessions))},
            **{f"device id {i}": d for i, d in enumerate(sorted(issued_devices))},
            "sealing key": get_settings().sealing_keys()[0],
        }
        logs = {f"log {n}": text.encode() for n, text in t_logs(t).items()}
        places: dict[str, bytes] = {
            **logs,
            "broker messages": b"\n".join(tap.messages.values()),
            "events (Flower)": b"\n".join(tap.events),
        }
        r = redis.Redis.from_url(url)
        # the homes of secrets (pool members, the proxy URL hashes of the global pool and the
        # site channel, the vault) hold them sealed: no key shows one, and they open to them
        homes = re.compile(r":\{demo(~\d+)?\}:pool:(cookie|device_id):secret$|:\{?proxy\}?:url$")
        opened: list[str] = []
        for key, value in scan_values(r, f"{t.prefix}:*"):
            for what, secret in targets.items():
                if secret.encode() in value:
                    found.setdefault(what, []).append(f"redis key {key}")
            if homes.search(key):
                opened.append(get_sealer().open(value.split(b"=", 1)[1]))
        # Redis's files at rest: the append-only file holds every write of the run; an RDB
        # dump, uncompressed so that a secret would show as its plain bytes
        r.config_set("rdbcompression", "no")
        r.save()
        files = at_rest(Path(t.redis.data_dir))
        places.update({f"redis file {n}": blob for n, blob in files.items()})
        for place, blob in places.items():
            for what, secret in targets.items():
                if secret.encode() in blob:
                    found.setdefault(what, []).append(place)

        log_bytes = sum(len(b) for b in logs.values())
        report(
            request.node.name,
            secrets_checked=len(targets),
            log_bytes_scanned=log_bytes,
            broker_messages_sampled=len(tap.messages),
            events_captured=len(tap.events),
            logins=site["logins"]["ok"],
            proxied_requests=sum(px.requests for px in proxies),
            elapsed_s=round(p.elapsed, 1),
            leaks=found,
        )
        assert found == {}
        # the searches were not vacuous: the masked banner, the secrets where they belong
        assert b"redis://:**@127.0.0.1" in b"".join(logs.values())
        assert len(tap.messages) > 10 and len(tap.events) > 50
        # the proxy pool and the demo channel keep the proxy URL with its credentials, sealed
        assert sum(f"{PROXY_USER}:{PROXY_PW}@" in o for o in opened) >= 2 * N_PROXIES
        aof = files["appendonly.aof"]
        assert len(aof) > 100_000 and MAGIC in aof and MAGIC in files["dump.rdb"]
        assert b":{proxy}:url" in aof and re.search(
            rb":\{demo(~\d+)?\}:pool:device_id:secret", files["dump.rdb"]
        )


def at_rest(data_dir: Path) -> dict[str, bytes]:
    """Every file Redis keeps in `data_dir`, after checking that only its owner may read it."""
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    files = {}
    for f in sorted(data_dir.iterdir()):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f"{f.name} is not 0600"
        files[f.name] = f.read_bytes()
    assert {"appendonly.aof", "dump.rdb"} <= set(files)
    return files


def t_logs(t: Any) -> dict[str, str]:
    return {p.name: p.read_text(errors="replace") for p in sorted(t.logs.glob("*.log"))}
