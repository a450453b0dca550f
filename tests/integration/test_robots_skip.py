"""A page robots.txt disallows is skipped once: committed as skipped, acknowledged, never
requeued.

A real worker crawls a local site whose sitemap lists public pages and pages its robots.txt
disallows; the disallowed children commit as `skipped` and their messages are acknowledged
on the first delivery (no "children not sent" requeue, no redelivery counted as a duplicate).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiohttp import web

import chains
import sites
from chains import Chain, step
from config import reset_settings
from tests.polite_site import PoliteSite, sitemapindex, urlset

pytestmark = pytest.mark.integration

PUBLIC = ["/page/1", "/page/2"]
PRIVATE = ["/private/1", "/private/2", "/private/3"]


class MixedSitemap(PoliteSite):
    """PoliteSite whose one sitemap lists public pages and disallowed ones."""

    async def sitemap(self, req: web.Request) -> web.Response:
        name = req.match_info["name"]
        if name == "sitemap_index.xml":
            body = sitemapindex(self.url, ["/sitemap-mixed.xml"])
        elif name == "sitemap-mixed.xml":
            body = urlset(self.url, PUBLIC + PRIVATE)
        else:
            return await super().sitemap(req)
        self._hit(req, 200)
        return web.Response(body=body, content_type="application/xml")


@pytest.fixture
def mixed_site() -> Iterator[MixedSitemap]:
    site = MixedSitemap()
    site.robots_body = site.robots_body.replace("Crawl-delay: 2\n", "")
    site.start()
    try:
        yield site
    finally:
        site.stop()


def test_a_child_disallowed_by_robots_txt_is_skipped_and_acknowledged_once(
    cc_env, start_worker, mixed_site, monkeypatch
) -> None:
    env = {
        "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.testsite,tests.politesite",
        "CHAINCRAWL_ROBOTS": "on",
        "POLITESITE_URL": mixed_site.url,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reset_settings()
    sites.load_all()
    w = start_worker(queues="politesite,resources,default", **env)

    chain = Chain("robots-skip", step("politesite.local.sitemap").then(
        step("politesite.local.page", url="url")))  # fmt: skip
    p = chains.run(chain, seeds=[{}]).wait(timeout=120)

    pages = p.steps["local.page"]
    assert p.complete and p.totals["failed"] == 0
    assert pages["succeeded"] == len(PUBLIC) and pages["skipped"] == len(PRIVATE)
    assert mixed_site.count("/private/") == 0  # never fetched
    log = w.text()
    assert "not sent" not in log and "message requeued" not in log, log[-3000:]
    assert log.count("skipped (robots") == len(PRIVATE), log[-3000:]  # each skipped once
