from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, ParseError, endpoint


class PageParams(Params):
    url: str


class Page(Item):
    item_type: ClassVar[str] = "politesite.page"
    key_fields: ClassVar[tuple[str, ...]] = ("url",)
    url: str
    title: str


@endpoint(PageParams, items=[Page], name="politesite.local.page")
def page(ctx: Context, p: PageParams) -> Outputs:
    title = ctx.get(p.url).css("h1::text").get()
    if title is None:
        raise ParseError(f"{p.url}: no <h1>")
    yield Page(url=p.url, title=title)
