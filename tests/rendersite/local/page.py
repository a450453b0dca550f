"""Render one URL (a demo page) and store its title: deadlines, captures, bans."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint


class PageParams(Params):
    url: str
    wait_for: str | None = None
    timeout: float | None = None


class Rendered(Item):
    item_type: ClassVar[str] = "rendersite.page"
    key_fields: ClassVar[tuple[str, ...]] = ("url",)
    url: str
    title: str


@endpoint(PageParams, items=[Rendered], name="rendersite.local.page", max_retries=1,
          resources=["browser", "cookie"])  # fmt: skip
def page(ctx: Context, p: PageParams) -> Outputs:
    rendered = ctx.render(p.url, wait_for=p.wait_for, timeout=p.timeout)
    yield Rendered(url=p.url, title=rendered.css("title::text").get(""))
