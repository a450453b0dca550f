"""Scroll a list to its end and store its entries, saying in the log what the scroll did."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from external_interface.browser import ScrollToEnd


class ScrollParams(Params):
    url: str


class Entry(Item):
    item_type: ClassVar[str] = "rendersite.entry"
    key_fields: ClassVar[tuple[str, ...]] = ("text",)
    text: str


@endpoint(ScrollParams, items=[Entry], name="rendersite.local.scroll", max_retries=1,
          resources=["browser"])  # fmt: skip
def scroll(ctx: Context, p: ScrollParams) -> Outputs:
    page = ctx.render(p.url, wait_for="li.item", actions=[ScrollToEnd(item="li.item")])
    step = page.steps[0]
    ctx.log.info("scrolled %d rounds, %d entries, complete=%s", step["rounds"], step["items"],
                 step["complete"])  # fmt: skip
    for text in page.css("li.item::text").getall():
        yield Entry(text=text)
