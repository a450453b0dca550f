"""demo js: the whole feed as an infinite scroll, `/js/scroll`, scrolled until its end shows."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from external_interface.browser import ScrollToEnd
from sites.demo.items import FeedEntry
from sites.demo.js import FEED_SETTLED, render
from sites.demo.markup import feed_entries


class ScrollParams(Params):
    pass


@endpoint(ScrollParams, items=[FeedEntry], resources=["browser", "user_agent"])
def scroll(ctx: Context, p: ScrollParams) -> Outputs:
    # `until`: a stall before the end fails the render (a retry), never a partial list
    page = render(
        ctx,
        "/js/scroll",
        FEED_SETTLED,
        actions=[ScrollToEnd(item=".feed-item", until="p.feed-end")],
    )
    yield from feed_entries(page)
