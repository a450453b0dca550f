"""Polite by default, end to end: a real worker crawls a site written for the purpose with the
defaults on (robots.txt honoured, the adaptive per-site delay, a default rate per site).

The site's robots.txt disallows `/private/`; its sitemap index has a plain child and a gzipped
one, each listing public pages and private ones; its pages answer 429 with `Retry-After` when
more than a few requests arrive within a second. The crawl stores exactly the public pages,
counts the private ones as skipped without ever fetching them, is slowed by the 429s but never
fails a page for them, and `./control.sh limits` shows the site's delay afterwards.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from collections.abc import Iterator

import pytest
from aiohttp import web

import chains
import sites
from chains import Chain, step
from config import ROOT, reset_settings
from external_interface.storage.sinks.jsonl import read_items
from tests.polite_site import PoliteSite, sitemapindex, urlset

pytestmark = pytest.mark.integration

PUBLIC = [f"/page/{i}" for i in range(12)]
PRIVATE = [f"/private/{i}" for i in range(5)]
RATE = 6  # requests a second the pages answer before 429


class LimitedPages(PoliteSite):
    """PoliteSite whose sitemaps mix public and private pages and whose pages are rate-limited."""

    async def sitemap(self, req: web.Request) -> web.Response:
        name, base = req.match_info["name"], self.url
        if name == "sitemap_index.xml":
            body = sitemapindex(base, ["/sitemap-a.xml", "/sitemap-b.xml.gz"])
        elif name == "sitemap-a.xml":
            body = urlset(base, PUBLIC[:6] + PRIVATE[:3])
        elif name == "sitemap-b.xml.gz":
            body = gzip.compress(urlset(base, PUBLIC[6:] + PRIVATE[3:]))
        else:
            return await super().sitemap(req)
        self._hit(req, 200)
        return web.Response(body=body, content_type="application/xml")

    async def page(self, req: web.Request) -> web.Response:
        resp = await self.limited(req)  # 429 + Retry-After past RATE a second, else 200
        if resp.status != 200:
            return resp
        return web.Response(text=f"<html><h1>{req.path}</h1></html>", content_type="text/html")


@pytest.fixture
def polite_site() -> Iterator[LimitedPages]:
    site = LimitedPages()
    site.limit_rate = RATE
    site.retry_after = "1"
    site.start()
    try:
        yield site
    finally:
        site.stop()


def test_a_polite_crawl_stores_the_allowed_pages_and_skips_the_disallowed_ones(
    cc_env, start_worker, polite_site, monkeypatch
) -> None:
    polite = {
        "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.testsite,tests.politesite",
        "CHAINCRAWL_ROBOTS": "on",
        "CHAINCRAWL_THROTTLE": "on",
        "CHAINCRAWL_THROTTLE_START_DELAY": "0.05",
        "CHAINCRAWL_THROTTLE_TARGET_CONCURRENCY": "2",
        "CHAINCRAWL_DEFAULT_LIMITS": "20/s,8",
        "CHAINCRAWL_MAX_RETRIES": "8",
        "POLITESITE_URL": polite_site.url,
    }
    for k, v in polite.items():
        monkeypatch.setenv(k, v)
    reset_settings()
    sites.load_all()
    start_worker(queues="politesite,resources,default", **polite)

    chain = Chain("polite", step("politesite.local.sitemap").then(
        step("politesite.local.page", url="url")))  # fmt: skip
    p = chains.run(chain, seeds=[{}]).wait(timeout=180)

    pages = p.steps["local.page"]
    assert p.complete and p.totals["failed"] == 0
    assert pages["succeeded"] == len(PUBLIC) and pages["skipped"] == len(PRIVATE)
    assert polite_site.count("/private/") == 0  # never fetched
    stored = sorted(i["url"].removeprefix(polite_site.url) for i in read_items("politesite.page"))
    assert stored == sorted(PUBLIC)
    assert polite_site.count("/page/", 429) > 0  # the site did push back
    assert pages["retried"] >= 1

    out = subprocess.run(
        [str(ROOT / "control.sh"), "limits", "--json"], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, **polite}, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    row = next(r for r in report["throttle"]["sites"] if r["site"] == "politesite")
    assert row["backoffs"] >= 1 and row["delay"] > 0
    assert report["robots"]["on"] is True
    assert any(r["scope"] == "*" for r in report["limits"])


def test_with_the_development_cache_a_second_crawl_sends_no_request(
    cc_env, start_worker, polite_site, monkeypatch, tmp_path
) -> None:
    """CHAINCRAWL_HTTP_CACHE: re-running a chain while iterating on a parser answers from disk
    (the limits, the delay and robots.txt are not asked either: nothing goes out)."""
    env = {
        "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.testsite,tests.politesite",
        "CHAINCRAWL_HTTP_CACHE": str(tmp_path / "httpcache"),
        "CHAINCRAWL_ROBOTS": "on",
        "POLITESITE_URL": polite_site.url,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reset_settings()
    sites.load_all()
    polite_site.limit_rate = 10_000  # this test is about the cache, not the 429s
    start_worker(queues="politesite,resources,default", **env)
    chain = Chain("cached", step("politesite.local.sitemap").then(
        step("politesite.local.page", url="url")))  # fmt: skip
    first = chains.run(chain, seeds=[{}]).wait(timeout=120)
    assert first.complete and first.steps["local.page"]["succeeded"] == len(PUBLIC)
    sent = len(polite_site.hits)
    assert sent > len(PUBLIC)  # robots.txt, the sitemaps and the pages
    second = chains.run(chain, seeds=[{}]).wait(timeout=120)
    assert second.complete and second.steps["local.page"]["succeeded"] == len(PUBLIC)
    assert second.steps["local.page"]["skipped"] == len(PRIVATE)
    assert len(polite_site.hits) == sent  # nothing went out the second time
