"""`render="auto"` on real workers against the demo's mix front: exact items, rendered only
where a fetch misses them, and the decision changed when a page type becomes rendered.

The `demo_mix` chain's two endpoints are written once against a Response. Its feed pages are
static and its post pages filled by script: the feed is learnt `http` (its samples agree) and
the posts `render` (a fetched post has no article to read). Then the demo switches the feed
to script too: the next run's first feed page, fetched, cannot be read where the samples had
items, is sampled at once, and the feed becomes `render`; both runs store every post.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rich.console import Console

import chains
from cli import status as cli_status
from config import get_settings
from demo.testing import DemoServer
from external_interface.fetch import FetchRequest, Urllib3Fetcher
from external_interface.fetch.adaptive import AdaptiveStore, Decision
from external_interface.storage.sinks.jsonl import iter_records
from monitor.metrics import read, task_key
from monitor.snapshot import snapshot
from sites.demo.markup import feed_entries
from tests.external_interface.browser_fixtures import needs_browser
from utils.redis import get_redis

pytestmark = [needs_browser, pytest.mark.integration, pytest.mark.timeout(420)]

WORKER_ENV = {
    "CHAINCRAWL_PROVIDERS": "user_agent=noop,device_id=noop,sign=noop,cookie=noop",
    "CHAINCRAWL_BROWSER_CONTEXTS": "2",
    "CHAINCRAWL_BROWSER_QUEUE_WAIT": "30",
    "CHAINCRAWL_VISIBILITY_TIMEOUT": "60",
    "CHAINCRAWL_BROWSER_TIMEOUT": "60",  # a busy machine: renders slow, not retried
    "CHAINCRAWL_BROWSER_ADAPTIVE_SAMPLES": "2",
    "CHAINCRAWL_BROWSER_ADAPTIVE_RESAMPLE": "0",  # here a change is caught by its first page
}


@pytest.fixture(scope="module")
def mixed() -> Iterator[DemoServer]:
    # 8 users, 2 a page: 4 static feed pages, 8 posts filled by script
    with DemoServer(users=8, posts_per_user=2, comments_per_post=0, pc_feed_page_size=2,
                    mix_rendered=["post"]) as server:  # fmt: skip
        yield server


def newest_posts(demo: DemoServer) -> list[str]:
    f, out, page = Urllib3Fetcher(), [], 1
    while (resp := f.fetch(FetchRequest("GET", f"{demo.url}/pc/feed?page={page}"))).status == 200:
        out += [e.post_id for e in feed_entries(resp)]
        page += 1
    return sorted(out)


def decisions() -> dict[str, Decision]:
    s = get_settings()
    return {d.pattern: d for d in AdaptiveStore(get_redis(), s.key_prefix).decisions()
            if d.endpoint.startswith("demo.mix.")}  # fmt: skip


def feed_metrics(ready: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """The feed endpoint's counts once `ready` (a worker writes its metrics every second)."""
    deadline = time.monotonic() + 30
    while True:
        m = read(get_redis(), task_key("demo.mix.feed", get_settings()))
        if ready(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def run_mix() -> tuple[list[str], int, int]:
    """The posts a demo_mix run stored, and the retries of its feed and post steps (a render
    that timed out on a busy machine is got again: one more page of its pattern)."""
    p = chains.run("demo_mix", seeds=[{}]).wait(timeout=300)
    assert p.complete and p.totals["failed"] == 0, p
    posts = sorted(r["item"]["post_id"] for r in iter_records("demo.post") if r["run"] == p.run_id)
    return posts, p.steps["mix.feed"]["retried"], p.steps["mix.detail"]["retried"]


def test_fetched_where_it_is_enough_rendered_where_not_and_relearnt_when_it_changes(
    start_worker: Any, mixed: DemoServer
) -> None:
    AdaptiveStore(get_redis(), get_settings().key_prefix).forget("demo.mix.feed", "/mix/feed?page")
    AdaptiveStore(get_redis(), get_settings().key_prefix).forget("demo.mix.detail", "/mix/post/*")
    start_worker(concurrency=4, queues="demo", DEMO_BASE_URL=mixed.url, **WORKER_ENV)
    want = newest_posts(mixed)
    assert len(want) == 8

    posts, feed_retries, post_retries = run_mix()
    assert posts == want  # exact: every post once, whichever way each page was got
    d = decisions()
    feed, post = d["/mix/feed?page"], d["/mix/post/*"]
    assert (feed.decision, feed.samples, feed.differ) == ("http", 2, 0)
    # 4 feed pages: the two samples rendered, then fetched only (exact without retries)
    assert feed.pages == 4 + feed_retries and feed.fetched + feed.rendered == feed.pages
    assert 2 <= feed.rendered <= 2 + feed_retries and feed.fetched >= 2
    assert post.decision == "render" and post.pages == post.rendered == 8 + post_retries
    assert post.fetched == 0  # every post rendered: a fetched one has no article to read
    assert post.evidence and not post.evidence[0]["same"] and post.evidence[0]["http_error"]
    m = feed_metrics(lambda m: m.get("adaptive_sampled", 0) + m.get("adaptive_fetched", 0) >= 4)
    assert 2 <= m.get("adaptive_sampled", 0) <= 2 + feed_retries
    assert m.get("adaptive_fetched", 0) >= 2
    assert 2 <= m.get("renders", 0) <= 2 + feed_retries  # rendered for its samples only

    mixed.set_mix(["feed", "post"])  # the feed is filled by script from now on
    posts, more_retries, _ = run_mix()
    assert posts == want
    feed = decisions()["/mix/feed?page"]
    assert feed.decision == "render" and feed.changes == 1
    newest = next(e for e in feed.evidence if not e["same"])
    assert newest["suspect"] and newest["rendered_items"] == 2 and newest["http_error"]
    # from the first page of the second run on, rendered: 1 sampled + 3 rendered pages
    retries = feed_retries + more_retries
    assert feed.pages == 8 + retries and 6 <= feed.rendered <= 6 + retries
    # `control.sh status` shows each decision, its share rendered and its newest sample
    snap = snapshot(workers_timeout=None)
    shown = {d["pattern"]: d for d in snap["adaptive"] if d["endpoint"] == "demo.mix.feed"}
    assert shown["/mix/feed?page"]["decision"] == "render"
    assert shown["/mix/feed?page"]["rendered_share"] == round(feed.rendered / feed.pages, 4)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(cli_status.render(snap))
    text = console.export_text()
    assert "adaptive rendering" in text and "demo.mix.feed /mix/feed?page" in text
