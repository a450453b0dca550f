"""demo secure: the feed index through the guarded front, one entry per user."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import need
from sites.demo.items import FeedEntry
from sites.demo.markup import feed_entries
from sites.demo.secure import FETCHER, get_guarded


class FeedParams(Params):
    page: int = 1


@endpoint(FeedParams, items=[FeedEntry], resources=["user_agent"], fetcher=FETCHER)
def feed(ctx: Context, p: FeedParams) -> Outputs:
    resp = get_guarded(ctx, "/pc/feed", page=p.page)
    need(resp, ".pager .total-pages::text")  # the last element: the page arrived whole
    yield from feed_entries(resp)
    if resp.css(".pager a.next"):
        yield ctx.follow(page=p.page + 1)
