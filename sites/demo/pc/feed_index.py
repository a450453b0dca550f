"""demo pc: the feed's shard step. Page 1 tells the page count, so every index page can be
requested at once (a sharded index) instead of following "next" links one at a time."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint, need_int
from sites.demo import get_html
from sites.demo.items import FeedPage


class FeedIndexParams(Params):
    pass


@endpoint(FeedIndexParams, items=[FeedPage], resources=["user_agent"])
def feed_index(ctx: Context, p: FeedIndexParams) -> Outputs:
    resp = get_html(ctx, "/pc/feed", page=1)
    total = need_int(resp, ".pager .total-pages::text")
    for page in range(1, total + 1):
        yield FeedPage(page=page, total_pages=total)
