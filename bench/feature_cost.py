"""The crawl `bench.redis_cost --features` measures: a demo chain as a user runs it with every
anti-crawl feature of the demo platform on, so the state store pays for what a real page
needs beside its commit: cookie and device leases, proxies, the gate, production chains.

The demo site runs with `features="all"` (captcha login, devices, request signing, the
user-agent check, a per-IP rate limit, soft failures); the demo chain (`demo_social`, or
`demo_app`) runs on real workers serving the site's queue and the resources queue. Every
demo request goes through local forward proxies on their own 127.0.0.x addresses
(`demo.proxy_farm`), fed to the pool the way a deployment feeds it: the
`resources.proxy.harvest` task reads the site's `/proxies` list and
`resources.proxy.validate_new` checks each against its `/headers`. The cookie and device pools
start empty and are filled by the site's production chains (logins, device registrations, up
to the demo's targets of 16 each) while the first, unmeasured crawl runs. As `./control.sh demo` runs the demo: the default
per-site limits and the adaptive throttle off (they are for other people's sites), robots.txt
on. This is tests/integration/test_demo_all_features.py's setup without its bans of sessions
and devices by rate and its dying proxy (a benchmark measures the steady state).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any, cast

from bench.chaincrawl_bench import steady_rate
from demo.proxy_farm import ProxyFarm
from demo.testing import DemoServer

HEALTHY = 8  # forward proxies, each its own client address to the site's per-IP limit
QUEUES = "demo,resources,default"

# the proxies as in the all-features test (the site's pools keep the demo's own targets, 16
# sessions and 16 devices); the rest as `./control.sh demo` sets it
WORKER_ENV = {
    "CHAINCRAWL_PROXY_SITES": "demo",
    "CHAINCRAWL_PROXY_CHECK_TIMEOUT": "1.5",
    "CHAINCRAWL_PROXY_REFILL_INTERVAL": "0.2",
    "CHAINCRAWL_MAX_RETRIES": "10",
    "CHAINCRAWL_DEFAULT_LIMITS": "off",
    "CHAINCRAWL_THROTTLE": "off",
    "CHAINCRAWL_ROBOTS": "true",
}


class FeatureSite(contextlib.ExitStack):
    """The demo site with every feature on behind `healthy` local forward proxies."""

    def __init__(self, size: str, healthy: int = HEALTHY, **demo: Any) -> None:
        super().__init__()
        self.size, self.healthy, self.overrides = size, healthy, demo
        self.demo: DemoServer
        self.farm: ProxyFarm

    def __enter__(self) -> FeatureSite:
        super().__enter__()
        self.farm = self.enter_context(ProxyFarm())
        listed = [self.farm.add_proxy().id for _ in range(self.healthy)]
        self.demo = self.enter_context(
            DemoServer(
                size=self.size,
                features="all",
                proxies=listed,
                stats_window_s=3600,  # every arrival of a crawl kept, for its steady rate
                **self.overrides,
            )
        )
        return self

    @property
    def config(self) -> Any:
        return self.demo.config

    def env(self) -> dict[str, str]:
        """What the workers and this process (the harvest, the runs) need to crawl it."""
        url = self.demo.url
        return {
            **WORKER_ENV,
            "DEMO_BASE_URL": url,
            "CHAINCRAWL_PROXY_SOURCES": json.dumps([f"page:{url}/proxies?page={{page}}"]),
            "CHAINCRAWL_PROXY_CHECK_URL": f"{url}/headers",
        }

    def feed_proxies(self) -> int:
        """Harvest the site's proxy list and validate it, in this process; -> proxies in the
        global pool (every healthy one, or the crawl would not be the one meant)."""
        from external_interface.resources.proxy import tasks
        from external_interface.resources.proxy.pool import GlobalPool

        tasks.harvest()
        tasks.validate_new()
        n = len(GlobalPool())
        if n != self.healthy:
            raise RuntimeError(f"{n} of {self.healthy} proxies validated")
        return n

    def crawl(self, chain: str, timeout: float = 600, runs: int = 1) -> argparse.Namespace:
        """`runs` runs of `chain` side by side, each over the whole site (one site's crawl as
        several runs), waited for: their pages (tasks the runs committed), items stored,
        failures, and the requests the site answered meanwhile (retries, logins, device
        registrations, proxy checks included)."""
        import chains

        start, before = time.time(), self.demo.stats()
        waits = waited()
        handles = [chains.run(chain, seeds=[{}]) for _ in range(runs)]
        totals = [h.wait(timeout=timeout, poll=0.2).totals for h in handles]
        waits = {k: n - waits.get(k, 0) for k, n in waited().items() if n > waits.get(k, 0)}
        after = self.demo.stats(timestamps=True)
        arrivals = sorted(
            t
            for entry in after["recent"]["by_ip"].values()
            for t in entry.get("timestamps", [])
            if t >= start
        )
        return argparse.Namespace(
            waited=waits,
            pages=sum(int(t["succeeded"]) for t in totals),
            items=sum(int(t["stored"]) for t in totals),
            failed=sum(int(t["failed"]) for t in totals),
            retried=sum(int(t.get("retried", 0)) for t in totals),
            requests=int(after["total"]) - int(before["total"]),
            # what the site answered and refused meanwhile (429: its per-IP rate limit), and
            # its requests/s once started and before the tail (5th to 95th percentile)
            statuses=_grew(before["by_status"], after["by_status"]),
            rejections=_grew(before["rejections"], after["rejections"]),
            # the requests of each client address (proxy): whether the crawl used them all
            by_ip=dict(sorted(_grew(before["by_ip"], after["by_ip"]).items())),
            steady_requests_per_s=round(steady_rate(arrivals), 1),
        )


def _grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that grew from `before` to `after`, by how much."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}


def waited() -> dict[str, int]:
    """The demo site's waits so far by error (its metrics, `waited:<error>`: a page that found
    no lease or slot free went back as a message of its own; the last second's may be unwritten
    yet)."""
    from monitor.metrics import site_key
    from utils.redis import as_str, get_redis

    got = get_redis().hgetall(site_key("demo"))
    return {
        as_str(k)[7:]: int(v)
        for k, v in cast("dict[bytes, bytes]", got).items()
        if as_str(k).startswith("waited:")
    }
