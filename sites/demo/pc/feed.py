"""demo pc: the feed index, `/pc/feed?page=N`, one entry per user (that user's newest post)."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import get_html, need
from sites.demo.items import FeedEntry
from sites.demo.markup import feed_entries


class FeedParams(Params):
    page: int = 1


@endpoint(FeedParams, items=[FeedEntry], resources=["user_agent"])
def feed(ctx: Context, p: FeedParams) -> Outputs:
    resp = get_html(ctx, "/pc/feed", page=p.page)
    need(resp, ".pager .total-pages::text")  # the last element: the page arrived whole
    yield from feed_entries(resp)
    if resp.css(".pager a.next"):
        yield ctx.follow(page=p.page + 1)
