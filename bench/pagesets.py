"""What a benchmark crawl crawls: a page set, its seed, its warm-up seed, the pages it must fetch.

    ps = PAGESETS["heavy"].build(quick=False)
    with ps.serve(latency_ms=0) as site:       # a replay server in its own process
        site.url_for(ps.seed.target), ps.expected_pages

Every page set is served from memory by `bench.replay_site` (a bare asyncio protocol in a
process of its own, its CPU counted apart), so every system crawls the same bytes at the same
server cost. `light` is the demo platform's pc pages, recorded from a demo server just before;
`shop` and `heavy` are the generated shop of `bench.shop_site` (8 KB / 8-50 KB product pages);
`small` is one category of five catalog pages seeded at its first page: 105 pages in 5
sequential hops. The warm-up seed is a subtree of the crawl (every page kind but the seed's
first), fetched once before the timed crawl by every system.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from bench import shop_site
from bench.replay_site import Page, ReplayServer
from bench.workload import site_for_pages


@dataclass(frozen=True)
class Seed:
    target: str  # request target on the page server: path and query
    kind: str  # the page kind of `bench.workload.RULES`


@dataclass(frozen=True)
class PageSet:
    name: str
    pages: Mapping[str, Page]
    seed: Seed
    warmup: Seed
    note: str

    @property
    def expected_pages(self) -> int:
        """Every page of the set is reachable from the seed, exactly once."""
        return len(self.pages)

    def serve(self, latency_ms: float = 0.0) -> ReplayServer:
        return ReplayServer(dict(self.pages), latency_ms=latency_ms)


@dataclass(frozen=True)
class PageSetSpec:
    """A page set's recipe at full and at `--quick` size; `pages` overrides the size."""

    name: str
    full: int
    quick: int
    make: Callable[[int], PageSet]

    def build(self, quick: bool = False, pages: int | None = None) -> PageSet:
        return replace(self.make(pages or (self.quick if quick else self.full)), name=self.name)


def light(pages: int) -> PageSet:
    users, posts, comments = site_for_pages(pages)
    rec = ReplayServer.record(users=users, posts_per_user=posts, comments_per_post=comments)
    return PageSet(
        "light",
        rec.pages,
        Seed("/pc/feed?page=1", "feed"),
        Seed("/pc/user/u1", "user"),
        "the demo's pc pages (1-3 KB)",
    )


def shop(pages: int, heavy: bool = False, catalog_pages: int = 10) -> PageSet:
    cfg = shop_site.for_pages(pages, heavy, catalog_pages)
    last = cfg.category_seed(cfg.categories, cfg.catalog_pages)
    return PageSet(
        "heavy" if heavy else "shop",
        shop_site.generate(cfg),
        Seed("/shop/", "home"),
        Seed(last, "catalog"),
        "shop, 8-50 KB product pages" if heavy else "shop, 8 KB product pages",
    )


def small(pages: int = 105) -> PageSet:
    """One category seeded at its first catalog page: 5 pages of 20 products = 105 pages."""
    cfg = shop_site.ShopConfig(categories=1, catalog_pages=max(1, round(pages / 21)))
    pages_ = {t: p for t, p in shop_site.generate(cfg).items() if t != "/shop/"}
    return PageSet(
        "small",
        pages_,
        Seed(cfg.category_seed(1), "catalog"),
        Seed(cfg.category_seed(1, cfg.catalog_pages), "catalog"),
        f"shop, one category: {cfg.catalog_pages} sequential catalog hops",
    )


PAGESETS: dict[str, PageSetSpec] = {
    "light": PageSetSpec("light", 2000, 600, light),
    "light10k": PageSetSpec("light10k", 10000, 1000, light),
    "shop": PageSetSpec("shop", 2100, 630, shop),
    "heavy": PageSetSpec("heavy", 2100, 630, lambda n: shop(n, heavy=True)),
    "shop1k": PageSetSpec("shop1k", 1050, 420, shop),
    "small": PageSetSpec("small", 105, 105, small),
}
