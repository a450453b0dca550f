"""demo pc: the feed index, `/pc/feed?page=N`, one entry per user (that user's newest post)."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import get_html
from sites.demo.items import FeedEntry
from sites.demo.markup import feed_page


class FeedParams(Params):
    page: int = 1


@endpoint(FeedParams, items=[FeedEntry], resources=["user_agent"])
def feed(ctx: Context, p: FeedParams) -> Outputs:
    yield from feed_page(ctx, get_html(ctx, "/pc/feed", page=p.page), p.page)
