"""The guarded demo front on real workers, through tinyproxy with credentials.

The front answers browsers only (TLS ClientHello, HTTP/2 SETTINGS and pseudo-header order,
header order, all against the user agent): the `demo_guarded` chain fails with urllib3 (a
403, `Forbidden`, dead-lettered) and stores every post with the impersonating fetcher, each
request tunnelled through the proxy and sent as whichever browser the rotating user agent
names (Chrome, Edge, Firefox, Safari).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import chains
from demo.testing import DemoServer
from external_interface.fetch import FetchRequest, Urllib3Fetcher
from external_interface.resources.proxy.channel import ChannelPool
from external_interface.resources.proxy.models import ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.storage.sinks.jsonl import iter_records
from monitor.deadletter import DeadLetterStore
from sites.demo.markup import feed_entries
from tests.external_interface.tinyproxy import Tinyproxy, needs_tinyproxy
from utils.redis import get_redis

pytestmark = [needs_tinyproxy, pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def guarded() -> Iterator[DemoServer]:
    with DemoServer(size="tiny", pc_feed_page_size=2, guard=True) as server:
        yield server


@pytest.fixture
def proxy() -> Iterator[Tinyproxy]:
    with Tinyproxy("crawler", "s3cret-pass") as p:
        pool = GlobalPool()
        pool.clear()
        ChannelPool("demo", pool).clear()
        pool.admit(ProxyAddress.parse(p.url), elapsed=0.1)
        yield p


def newest_posts(demo: DemoServer) -> list[str]:
    """Every user's newest post, read from the unguarded pc feed: what the chain must store."""
    f, page = Urllib3Fetcher(), 1
    out: list[str] = []
    while True:
        resp = f.fetch(FetchRequest("GET", f"{demo.url}/pc/feed?page={page}"))
        if resp.status == 404:
            return sorted(out)
        out += [e.post_id for e in feed_entries(resp)]
        page += 1


def worker_env(demo: DemoServer, **extra: str) -> dict[str, str]:
    return {
        "DEMO_BASE_URL": demo.url,
        "DEMO_GUARD_URL": demo.guard_url,
        "CHAINCRAWL_CA_BUNDLE": str(demo.guard_ca),
        "CHAINCRAWL_PROXY_SITES": "demo",
        # the real user-agent rotation: desktop Chrome, Edge, Firefox and Safari
        "CHAINCRAWL_PROVIDERS": "device_id=noop,sign=noop,cookie=noop",
        **extra,
    }


def test_the_guarded_chain_fails_with_urllib3_and_stores_every_post_impersonating(
    start_worker: Any, guarded: DemoServer, proxy: Tinyproxy
) -> None:
    # the site's fetcher set to urllib3 by the deployment, over the endpoints' declaration
    w = start_worker(concurrency=4, queues="demo", CHAINCRAWL_MAX_RETRIES="1",
                     **worker_env(guarded, CHAINCRAWL_FETCHER_DEMO="urllib3"))  # fmt: skip
    p = chains.run("demo_guarded", seeds=[{}]).wait(timeout=120)
    assert p.complete and p.totals["stored"] == 0 and p.totals["failed"] == 1
    letters = DeadLetterStore(get_redis()).list(run=p.run_id)
    assert [(d.task, d.error_type) for d in letters] == [("demo.secure.feed", "Forbidden")]
    assert "403" in letters[0].error
    tunnels_before = proxy.tunnels()
    assert tunnels_before >= 1  # it went through the proxy, and was refused there
    w.stop()

    start_worker(concurrency=4, queues="demo", **worker_env(guarded))
    p = chains.run("demo_guarded", seeds=[{}]).wait(timeout=120)
    assert p.complete and p.totals["failed"] == 0
    stored = sorted(r["item"]["post_id"] for r in iter_records("demo.post") if r["run"] == p.run_id)
    assert stored == newest_posts(guarded) and len(stored) == guarded.config.users
    pages = p.steps["secure.feed"]["succeeded"] + p.steps["secure.detail"]["succeeded"]
    assert pages == 3 + guarded.config.users  # 5 users, 2 a page: 3 feed pages, 5 posts
    assert proxy.tunnels() > tunnels_before  # every connection tunnelled through the proxy
    # the platform behind the front saw every page, each sent as a browser
    by_endpoint = guarded.stats()["by_endpoint"]
    assert by_endpoint["pc.feed"] >= 3 and by_endpoint["pc.post"] >= guarded.config.users
