"""The bench shop: pages of the weight users crawl, generated from a seed, never fetched.

    pages = generate(ShopConfig(categories=10, catalog_pages=10, heavy=True))
    len(pages) == ShopConfig(...).expected_pages == 2101

Why: the demo platform's pages are light (1-3 KB, a few dozen elements), so a benchmark on
them flatters a framework whose cost is per page rather than per byte. The shop has the shape of
a real catalog crawl (`bench.workload` rules `home`, `catalog`, `product`):

    /shop/                 home: one link per category (followed)
    /shop/c/{cid}?page=N   catalog: 20 product links + a "next" link (both followed)
    /shop/p/{pid}          product: 3 fields (SKU, title, price), no link followed

Two weights. `heavy=False`: a product page of about 8 KB with about 150 elements (header menu,
breadcrumb, gallery, buy box, feature list, spec table, description, reviews, footer).
`heavy=True`: product pages of 8-50 KB with hundreds of elements: a nested mega menu, inline
`<style>` and `<script>` blocks (a JSON-LD record, a tracking snippet), nested review threads,
related-product cards, a facet sidebar on catalog pages. Decoys sit outside the extracted
nodes (related products have prices and links too), so a selector must be as specific as a
real one. Every page is a function of (config, page id): the same bytes on every machine.
"""

from __future__ import annotations

import html
import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from bench.replay_site import Page

PER_PAGE = 20
HEADERS = (("Content-Type", "text/html; charset=utf-8"),)
WORDS = [
    "steel",
    "oak",
    "linen",
    "matte",
    "compact",
    "wireless",
    "quiet",
    "durable",
    "classic",
    "modern",
    "studio",
    "travel",
    "daily",
    "outdoor",
    "premium",
    "soft",
    "light",
    "heavy",
    "fold",
    "water",
    "proof",
    "thermal",
    "smart",
    "eco",
    "cotton",
    "leather",
    "glass",
    "ceramic",
    "frame",
    "blade",
    "grip",
    "tone",
    "wave",
    "pulse",
    "spark",
    "prime",
    "nova",
    "terra",
    "aqua",
    "solar",
    "lunar",
    "delta",
    "crème",
    "brûlée",
    "naïve",
    "café",
    "façade",
    "über",
    "señor",
]
CATEGORY_NAMES = (
    "Kitchen",
    "Garden",
    "Audio",
    "Lighting",
    "Outdoor",
    "Office",
    "Bath",
    "Travel",
    "Tools",
    "Textiles",
    "Storage",
    "Toys",
)


@dataclass(frozen=True)
class ShopConfig:
    categories: int = 10
    catalog_pages: int = 10  # per category, 20 products each
    heavy: bool = False
    seed: int = 1

    def __post_init__(self) -> None:
        if self.categories < 1 or self.catalog_pages < 1:
            raise ValueError(
                f"a shop needs at least 1 category and 1 catalog page, not "
                f"categories={self.categories}, catalog_pages={self.catalog_pages}"
            )

    @property
    def products(self) -> int:
        return self.categories * self.catalog_pages * PER_PAGE

    @property
    def expected_pages(self) -> int:
        """Pages a crawl seeded at the home page fetches: home, catalogs, products."""
        return 1 + self.categories * self.catalog_pages * (1 + PER_PAGE)

    def category_seed(self, cid: int, page: int = 1) -> str:
        return f"/shop/c/{cid}?page={page}"


def for_pages(pages: int, heavy: bool = False, catalog_pages: int = 10) -> ShopConfig:
    """A shop of about `pages` pages (21 per catalog page, plus the home page)."""
    return ShopConfig(max(1, round((pages - 1) / (catalog_pages * 21))), catalog_pages, heavy)


class _Words:
    """Deterministic filler: one generator per page, seeded by (shop seed, page id)."""

    def __init__(self, seed: int, key: str) -> None:
        self.rng = random.Random(f"{seed}:{key}")

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def title(self, n: int = 3) -> str:
        return self.words(n).title()

    def n(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def price(self) -> str:
        return f"{self.rng.randint(3, 900)}.{self.rng.randint(0, 99):02d}"


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _head(title: str, w: _Words, heavy: bool, canonical: str) -> str:
    out = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)} | Bench Shop</title>",
        f'<meta name="description" content="{_esc(w.words(18))}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="stylesheet" href="/static/shop.css">',
        f'<link rel="canonical" href="{canonical}">',
    ]
    if heavy:
        rules = [
            f".{c}-{i} {{ margin: {i}px {i * 2}px; color: #{w.n(0, 0xFFFFFF):06x}; "
            f"font: {w.n(11, 18)}px/1.4 sans-serif; }}"
            for c in ("card", "menu", "badge", "facet")
            for i in range(w.n(1, 12))
        ]
        out.append(f"<style>{' '.join(rules)}</style>")
        out.append(
            "<script>window.dataLayer=window.dataLayer||[];function gtag(){dataLayer.push("
            f"arguments)}}gtag('js',new Date());gtag('config','BS-{w.n(1000, 9999)}');"
            + "".join(
                f"dataLayer.push({{event:'view_{i}',value:{w.n(1, 999)}}});"
                for i in range(w.n(1, 20))
            )
            + "</script>"
        )
    out.append("</head>")
    return "".join(out)


def _header(cfg: ShopConfig, w: _Words) -> str:
    links = "".join(
        f'<li><a href="{cfg.category_seed(c)}">{CATEGORY_NAMES[(c - 1) % len(CATEGORY_NAMES)]}</a></li>'
        for c in range(1, min(cfg.categories, 8) + 1)
    )
    out = (
        '<header><a class="brand" href="/shop/">Bench Shop</a>'
        f'<nav class="top"><ul>{links}</ul></nav>'
        '<form class="search" action="/shop/search"><input name="q" placeholder="Search">'
        "<button>Search</button></form></header>"
    )
    if cfg.heavy:  # a mega menu: three levels of nested lists
        tops = []
        for i in range(w.n(2, 6)):
            subs = []
            for j in range(w.n(3, 5)):
                leaves = "".join(
                    f'<li><a class="menu-{k}" href="/shop/s/{i}-{j}-{k}">{w.title(2)}</a></li>'
                    for k in range(w.n(2, 5))
                )
                subs.append(f"<li><span>{w.title(1)}</span><ul>{leaves}</ul></li>")
            tops.append(
                f'<li class="menu-{i}"><span>{w.title(1)}</span><ul>{"".join(subs)}</ul></li>'
            )
        out += f'<nav class="mega"><ul>{"".join(tops)}</ul></nav>'
    return out


def _footer(w: _Words) -> str:
    links = "".join(f'<li><a href="/shop/info/{i}">{w.title(2)}</a></li>' for i in range(10))
    return f"<footer><ul>{links}</ul><p>© Bench Shop, prices in €</p></footer></body></html>"


def _product(cfg: ShopConfig, pid: int, cid: int) -> str:
    w = _Words(cfg.seed, f"p{pid}")
    title = w.title(4)
    cat = CATEGORY_NAMES[(cid - 1) % len(CATEGORY_NAMES)]
    heavy = cfg.heavy
    gallery = "".join(f'<img src="/img/{pid}-{i}.jpg" alt="{_esc(w.words(3))}">' for i in range(4))
    features = "".join(f"<li>{_esc(w.words(6))}</li>" for _ in range(8))
    specs = "".join(
        f"<tr><th>{_esc(w.title(2))}</th><td>{_esc(w.words(3))}</td></tr>" for _ in range(10)
    )
    desc = "".join(f"<p>{_esc(w.words(w.n(75, 95)))}</p>" for _ in range(3))
    reviews = []
    for r in range(w.n(0, 60) if heavy else 8):
        replies = ""
        if heavy and r % 3 == 0:
            replies = (
                '<ul class="replies">'
                + "".join(
                    f'<li><span class="author">{w.title(1)}</span><p>{_esc(w.words(w.n(8, 30)))}</p></li>'
                    for _ in range(w.n(1, 3))
                )
                + "</ul>"
            )
        reviews.append(
            f'<div class="review"><span class="author">{w.title(2)}</span>'
            f'<span class="rating">{w.n(1, 5)}</span><p>{_esc(w.words(w.n(30, 45)))}</p>{replies}</div>'
        )
    body = [
        _head(title, w, heavy, f"/shop/p/{pid}"),
        '<body data-shop="bench-shop">',
        _header(cfg, w),
        f'<ol class="breadcrumb"><li><a href="/shop/">Home</a></li>'
        f'<li><a href="{cfg.category_seed(cid)}">{cat}</a></li><li>{_esc(title)}</li></ol>',
        f'<main><article class="product" data-sku="SKU-{pid:06d}">',
        f'<h1 class="product-title">{_esc(title)}</h1>',
        f'<div class="gallery">{gallery}</div>',
        f'<div class="buy-box"><div class="price"><span class="currency">EUR</span>'
        f'<span class="amount">{w.price()}</span></div><p class="stock">In stock</p>'
        f'<button class="add" data-pid="{pid}">Add to cart</button></div>',
        f'<ul class="features">{features}</ul>',
        f'<table class="specs"><tbody>{specs}</tbody></table>',
        f'<div class="description">{desc}</div>',
        f'<section class="reviews"><h2>Reviews</h2>{"".join(reviews)}</section>',
        "</article>",
    ]
    if heavy:
        ld = {
            "@context": "https://schema.org",
            "@type": "Product",
            "sku": f"SKU-{pid:06d}",
            "name": title,
            "description": w.words(40),
            "offers": {"@type": "Offer", "priceCurrency": "EUR", "price": w.price()},
        }
        body.append(f'<script type="application/ld+json">{json.dumps(ld)}</script>')
        cards = "".join(_card(w, pid * 31 + i) for i in range(w.n(2, 16)))
        body.append(f'<section class="related"><h2>You may also like</h2>{cards}</section>')
    body += ["</main>", _footer(w)]
    return "".join(body)


def _card(w: _Words, pid: int) -> str:
    """A product teaser (related products, heavy catalog pages): a price and a link of its own."""
    badges = "".join(f'<li class="badge-{i}">{w.title(1)}</li>' for i in range(w.n(1, 3)))
    return (
        f'<div class="card"><a href="/shop/p/{pid}?ref=related"><img src="/img/{pid}-0.jpg" alt="">'
        f'<span class="name">{_esc(w.title(3))}</span></a><div class="price">'
        f'<span class="amount">{w.price()}</span></div><ul class="badges">{badges}</ul></div>'
    )


def _catalog(cfg: ShopConfig, cid: int, page: int) -> str:
    w = _Words(cfg.seed, f"c{cid}-{page}")
    cat = CATEGORY_NAMES[(cid - 1) % len(CATEGORY_NAMES)]
    first = ((cid - 1) * cfg.catalog_pages + (page - 1)) * PER_PAGE + 1
    items = []
    for pid in range(first, first + PER_PAGE):
        extra = ""
        if cfg.heavy:
            extra = (
                f'<img src="/img/{pid}-0.jpg" alt=""><span class="rating">{w.n(1, 5)}</span>'
                f'<ul class="badges"><li>{w.title(1)}</li><li>{w.title(1)}</li></ul>'
                f'<p class="teaser">{_esc(w.words(w.n(10, 25)))}</p>'
            )
        items.append(
            f'<li class="item"><a class="product-link" href="/shop/p/{pid}">{_esc(w.title(4))}</a>'
            f'<span class="price">{w.price()} €</span>{extra}</li>'
        )
    nxt = f'<a class="next" href="?page={page + 1}">next</a>' if page < cfg.catalog_pages else ""
    prev = f'<a class="prev" href="?page={page - 1}">prev</a>' if page > 1 else ""
    body = [
        _head(f"{cat}, page {page}", w, cfg.heavy, cfg.category_seed(cid, page)),
        '<body data-shop="bench-shop">',
        _header(cfg, w),
        "<main>",
    ]
    if cfg.heavy:  # a facet sidebar: nested lists of filters
        facets = "".join(
            f'<li class="facet-{i}"><span>{w.title(1)}</span><ul>'
            + "".join(
                f'<li><label><input type="checkbox"> {w.title(1)}</label></li>'
                for _ in range(w.n(3, 8))
            )
            + "</ul></li>"
            for i in range(w.n(4, 8))
        )
        body.append(f'<aside class="filters"><ul>{facets}</ul></aside>')
    body += [
        f'<section class="catalog" data-category="{cid}"><h1 class="category-name">{cat}</h1>',
        f'<ul class="items">{"".join(items)}</ul>',
        f'<div class="pager">{prev}<span class="current">{page}</span>{nxt}</div></section>',
        "</main>",
        _footer(w),
    ]
    return "".join(body)


def _home(cfg: ShopConfig) -> str:
    w = _Words(cfg.seed, "home")
    links = "".join(
        f'<li><a class="category-link" href="{cfg.category_seed(c)}">'
        f"{CATEGORY_NAMES[(c - 1) % len(CATEGORY_NAMES)]} {c}</a></li>"
        for c in range(1, cfg.categories + 1)
    )
    return "".join(
        [
            _head("Welcome", w, cfg.heavy, "/shop/"),
            '<body data-shop="bench-shop">',
            _header(cfg, w),
            f'<main><nav class="categories" data-count="{cfg.categories}"><ul>{links}</ul></nav>',
            f"<p>{_esc(w.words(40))}</p></main>",
            _footer(w),
        ]
    )


def generate(cfg: ShopConfig) -> dict[str, Page]:
    """Every page of the shop: {request target: Page}, served as they are by the replay server."""
    page: Callable[[str], Page] = lambda text: Page(200, HEADERS, text.encode("utf-8"))  # noqa: E731
    pages = {"/shop/": page(_home(cfg))}
    for cid in range(1, cfg.categories + 1):
        for n in range(1, cfg.catalog_pages + 1):
            pages[cfg.category_seed(cid, n)] = page(_catalog(cfg, cid, n))
            first = ((cid - 1) * cfg.catalog_pages + (n - 1)) * PER_PAGE + 1
            for pid in range(first, first + PER_PAGE):
                pages[f"/shop/p/{pid}"] = page(_product(cfg, pid, cid))
    return pages
