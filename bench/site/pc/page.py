"""benchsite.pc.page: one page of a bench page set (the demo's pc pages, the shop), the same
parse work as every other system of `bench.compare` (`bench.workload`, by the page's kind).

Fetch, 3 CSS fields (`bench.workload.parse`), one stored `benchsite.page` item, one
`benchsite.link` item per followed link (not stored: they feed the next chain step, whose
`unique` option is the dedup check), and a follow-up for the page's "next" link.
"""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import urljoin

from base_task import Context, Item, Outputs, Params, endpoint
from bench.workload import parse


class PageParams(Params):
    url: str
    kind: str


class Page(Item):
    item_type: ClassVar[str] = "benchsite.page"
    key_fields: ClassVar[tuple[str, ...]] = ("url",)

    url: str
    kind: str
    f1: str | None
    f2: str | None
    f3: str | None


class Link(Item):
    item_type: ClassVar[str] = "benchsite.link"
    key_fields: ClassVar[tuple[str, ...]] = ("url",)
    store: ClassVar[bool] = False

    url: str


@endpoint(PageParams, items=[Page, Link], name="benchsite.pc.page")
def page(ctx: Context, p: PageParams) -> Outputs:
    resp = ctx.get(p.url)
    fields, links, nxt = parse(p.kind, resp)
    yield Page(url=resp.url, kind=p.kind, **fields)
    for href in links:
        yield Link(url=urljoin(resp.url, href))
    if nxt:
        yield ctx.follow(url=urljoin(resp.url, nxt))
