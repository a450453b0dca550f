"""The benchmark workload, shared by every crawler the benchmark runs (the chaincrawl endpoint,
the Scrapy spider, the Crawlee crawler, the no-framework floor) so that all do exactly the same
parse work on exactly the same pages. Standard library only: the Crawlee peer imports it from
its own virtual environment.

Page kinds are unique across the page sets, so a rule is found by kind alone. The light pages
walk the demo platform's pc front end (demo/README.md section 4):

    /pc/feed?page=N ──> /pc/user/{uid}?page=N ──> /pc/post/{pid} ──> /pc/post/{pid}/comments?page=N
      (next pages)        (next pages)                                 (next pages)

Per page: 3 fields extracted with CSS selectors (parsel, on the decoded text), one item
`{url, kind, f1, f2, f3}` stored, the listed links followed (deduplicated: each URL once),
plus the page's own "next" link. A site of U users, P posts per user, C comments per post
gives exactly `expected_pages(U, P, C)` pages (= the demo's pc `requests` count).

The shop (`bench/shop_site.py`) has the shape of what users crawl:

    /shop/ ──> /shop/c/{cid}?page=N ──> /shop/p/{pid}
     (home)     (catalog: 20 product links + next)   (product: 3 fields, no links followed)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    fields: tuple[str, str, str]  # 3 CSS queries, `.get()` each
    links: str | None  # CSS query of the hrefs to follow, `.getall()`
    link_kind: str | None  # the kind of page those links lead to
    next: str | None  # CSS query of the "next page" href of the same kind


RULES: dict[str, Rule] = {
    "feed": Rule(
        fields=(
            "section.feed h1.section-title::text",
            ".pager .current-page::text",
            "section.feed::attr(data-total)",
        ),
        links="section.feed a.user-link::attr(href)",
        link_kind="user",
        next=".pager a.next::attr(href)",
    ),
    "user": Rule(
        fields=(
            "div.profile::attr(data-uid)",
            "div.profile h1.name::text",
            "div.profile .followers::text",
        ),
        links="ul.post-list a.post-link::attr(href)",
        link_kind="post",
        next=".pager a.next::attr(href)",
    ),
    "post": Rule(
        fields=(
            "article.post-detail::attr(data-pid)",
            "article.post-detail h1.title::text",
            "article.post-detail .meta .likes::text",
        ),
        links="article.post-detail a.comments-link::attr(href)",
        link_kind="comments",
        next=None,
    ),
    "comments": Rule(
        fields=(
            "section.comments::attr(data-pid)",
            "section.comments h1.title a::text",
            "section.comments::attr(data-total)",
        ),
        links=None,
        link_kind=None,
        next=".pager a.next::attr(href)",
    ),
    "home": Rule(
        fields=("body::attr(data-shop)", "header .brand::text", "nav.categories::attr(data-count)"),
        links="nav.categories a.category-link::attr(href)",
        link_kind="catalog",
        next=None,
    ),
    "catalog": Rule(
        fields=(
            "section.catalog::attr(data-category)",
            "section.catalog h1.category-name::text",
            ".pager .current::text",
        ),
        links="section.catalog li.item a.product-link::attr(href)",
        link_kind="product",
        next=".pager a.next::attr(href)",
    ),
    "product": Rule(
        fields=(
            "article.product::attr(data-sku)",
            "article.product h1.product-title::text",
            "article.product .buy-box .price .amount::text",
        ),
        links=None,
        link_kind=None,
        next=None,
    ),
}


def kinds_from(kind: str) -> list[str]:
    """The chain of page kinds a crawl seeded at `kind` walks: `catalog` -> [catalog, product]."""
    out = [kind]
    while (nxt := RULES[out[-1]].link_kind) is not None:
        out.append(nxt)
    return out


def parse(kind: str, sel: Any) -> tuple[dict[str, str | None], list[str], str | None]:
    """(3 fields, hrefs to follow, next href) of one page; `sel` is a parsel Selector or a
    Scrapy response (both have `.css`)."""
    rule = RULES[kind]
    f1, f2, f3 = (sel.css(q).get() for q in rule.fields)
    links = sel.css(rule.links).getall() if rule.links else []
    nxt = sel.css(rule.next).get() if rule.next else None
    return {"f1": f1, "f2": f2, "f3": f3}, links, nxt


def _pages(n: int, size: int) -> int:
    return max(1, math.ceil(n / size))


def expected_pages(users: int, posts: int, comments: int) -> int:
    """Pages the crawl fetches with the demo's default pc page sizes (20 / 10 / 10)."""
    return (
        _pages(users, 20)
        + users * _pages(posts, 10)
        + users * posts
        + users * posts * _pages(comments, 10)
    )


def site_for_pages(pages: int, posts: int = 10, comments: int = 5) -> tuple[int, int, int]:
    """(U, P, C) giving about `pages` pages (2 + 1/P pages per post with P <= 10, C <= 10)."""
    per_user = 1 + posts * 2
    users = max(1, round(pages / per_user))
    return users, posts, comments
