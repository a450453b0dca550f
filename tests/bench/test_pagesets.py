"""bench/pagesets.py: each page set's seed reaches exactly its pages, its warm-up seed is one of
them, and the replay server counts distinct pages (a page fetched twice shows)."""

from __future__ import annotations

import pytest
import urllib3

from bench.pagesets import PAGESETS

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("name", "pages"), [("shop", 211), ("heavy", 211), ("small", 105)])
def test_sizes_and_seeds(name: str, pages: int) -> None:
    ps = PAGESETS[name].build(pages=pages)
    assert ps.name == name and ps.expected_pages == pages
    assert ps.seed.target in ps.pages and ps.warmup.target in ps.pages
    assert ps.seed.kind == ("catalog" if name == "small" else "home")


def test_small_is_five_sequential_catalog_hops() -> None:
    ps = PAGESETS["small"].build()
    catalogs = sorted(t for t in ps.pages if t.startswith("/shop/c/"))
    assert catalogs == [f"/shop/c/1?page={n}" for n in range(1, 6)]
    assert ps.seed.target == "/shop/c/1?page=1" and ps.warmup.target == "/shop/c/1?page=5"


def test_light_is_the_demo_recorded() -> None:
    ps = PAGESETS["light"].build(pages=63)  # 3 users: 1 feed, 3 user, 30 post, 30 comment pages
    assert ps.expected_pages == 64 and ps.seed.target == "/pc/feed?page=1"


def test_the_server_counts_distinct_pages() -> None:
    ps = PAGESETS["small"].build()
    with ps.serve() as site:
        http = urllib3.PoolManager()
        for target in ("/shop/p/1", "/shop/p/1", "/shop/p/2"):
            assert http.request("GET", site.url_for(target)).status == 200
        st = site.stats()
        assert (st["total"], st["distinct"]) == (3, 2)
        site.reset()
        assert site.stats()["distinct"] == 0
