"""bench/shop_site.py: the shop serves what it says (page weights, element and link counts, the
3 fields), the same bytes for the same seed, and every page reachable from the home page."""

from __future__ import annotations

import statistics
from urllib.parse import urljoin

import pytest
from lxml import html
from parsel import Selector

from bench.shop_site import PER_PAGE, ShopConfig, for_pages, generate
from bench.workload import RULES, parse

LIGHT = ShopConfig(categories=2, catalog_pages=3)
HEAVY = ShopConfig(categories=2, catalog_pages=3, heavy=True)


@pytest.fixture(scope="module")
def light() -> dict:
    return generate(LIGHT)


@pytest.fixture(scope="module")
def heavy() -> dict:
    return generate(HEAVY)


def _products(pages: dict) -> list[bytes]:
    return [p.body for t, p in pages.items() if t.startswith("/shop/p/")]


def _elements(body: bytes) -> int:
    return len(html.fromstring(body).xpath("//*"))


def test_product_pages_weigh_about_8_kb_with_about_150_elements(light: dict) -> None:
    bodies = _products(light)
    assert len(bodies) == LIGHT.products == 2 * 3 * PER_PAGE
    sizes = [len(b) for b in bodies]
    assert min(sizes) >= 7_000 and max(sizes) <= 9_000, (min(sizes), max(sizes))
    counts = {_elements(b) for b in bodies}
    assert all(140 <= n <= 170 for n in counts), counts


def test_heavy_product_pages_are_8_to_50_kb_with_hundreds_of_elements(heavy: dict) -> None:
    bodies = _products(heavy)
    sizes = [len(b) for b in bodies]
    assert min(sizes) >= 8_000 and max(sizes) <= 50_000, (min(sizes), max(sizes))
    assert statistics.median(sizes) > 20_000
    counts = [_elements(b) for b in bodies]
    assert min(counts) >= 200 and statistics.median(counts) >= 400, counts
    page = heavy["/shop/p/7"].body
    assert page.count(b"<script") >= 2 and b"<style>" in page
    tree = html.fromstring(page)
    assert tree.xpath("//nav[@class='mega']/ul/li/ul/li/ul/li")  # three levels of nested lists


@pytest.mark.parametrize("cfg", [LIGHT, HEAVY], ids=["light", "heavy"])
def test_links_and_fields(cfg: ShopConfig) -> None:
    pages = generate(cfg)
    home = Selector(text=pages["/shop/"].body.decode())
    fields, links, nxt = parse("home", home)
    assert fields == {"f1": "bench-shop", "f2": "Bench Shop", "f3": str(cfg.categories)}
    assert links == [cfg.category_seed(c) for c in range(1, cfg.categories + 1)] and nxt is None
    for n in range(1, cfg.catalog_pages + 1):
        target = cfg.category_seed(2, n)
        fields, links, nxt = parse("catalog", Selector(text=pages[target].body.decode()))
        assert fields == {"f1": "2", "f2": "Garden", "f3": str(n)}
        first = (cfg.catalog_pages + n - 1) * PER_PAGE + 1
        assert links == [f"/shop/p/{pid}" for pid in range(first, first + PER_PAGE)]
        last = n == cfg.catalog_pages
        assert (nxt is None) if last else urljoin(target, nxt) == cfg.category_seed(2, n + 1)
    fields, links, nxt = parse("product", Selector(text=pages["/shop/p/61"].body.decode()))
    assert fields["f1"] == "SKU-000061" and fields["f2"] and links == [] and nxt is None
    assert fields["f3"] is not None and float(fields["f3"]) > 0
    if cfg.heavy:  # the decoys: related products carry prices and product links of their own
        sel = Selector(text=pages["/shop/p/61"].body.decode())
        assert len(sel.css(".price .amount::text").getall()) > 1


@pytest.mark.parametrize("cfg", [LIGHT, HEAVY], ids=["light", "heavy"])
def test_every_page_is_reachable_from_home_once(cfg: ShopConfig) -> None:
    pages = generate(cfg)
    seen, todo = {"/shop/"}, [("/shop/", "home")]
    while todo:
        target, kind = todo.pop()
        _, links, nxt = parse(kind, Selector(text=pages[target].body.decode()))
        kids = [(urljoin(target, h), RULES[kind].link_kind) for h in links]
        kids += [(urljoin(target, nxt), kind)] if nxt else []
        for url, k in kids:
            assert url in pages, url
            if url not in seen:
                assert k is not None  # a page with links has a link kind
                seen.add(url)
                todo.append((url, k))
    assert seen == set(pages) and len(pages) == cfg.expected_pages == 1 + 2 * 3 * 21


def test_deterministic_from_the_seed() -> None:
    a, b = generate(HEAVY), generate(HEAVY)
    assert a == b
    other = generate(ShopConfig(categories=2, catalog_pages=3, heavy=True, seed=2))
    assert other.keys() == a.keys() and other["/shop/p/7"].body != a["/shop/p/7"].body


def test_size_from_pages_and_bad_sizes() -> None:
    assert for_pages(2100).expected_pages == 2101
    assert for_pages(105, catalog_pages=5).expected_pages == 106
    with pytest.raises(ValueError, match="at least 1 category"):
        ShopConfig(categories=0)
