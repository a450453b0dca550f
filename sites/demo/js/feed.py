"""demo js: a list page, `/js/feed?page=N`, rendered until its script has drawn the entries."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint, need
from sites.demo.items import FeedEntry
from sites.demo.js import FEED_SETTLED, render
from sites.demo.markup import feed_entries


class FeedParams(Params):
    page: int = 1


@endpoint(FeedParams, items=[FeedEntry], resources=["browser", "user_agent"])
def feed(ctx: Context, p: FeedParams) -> Outputs:
    page = render(ctx, f"/js/feed?page={p.page}", FEED_SETTLED)
    need(page, ".pager .total-pages::text")  # drawn after the entries: the page is complete
    yield from feed_entries(page)
    if page.css(".pager a.next"):
        yield ctx.follow(page=p.page + 1)
