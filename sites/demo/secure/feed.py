"""demo secure: the feed index through the guarded front, one entry per user."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo.items import FeedEntry
from sites.demo.markup import feed_page
from sites.demo.secure import FETCHER, get_guarded


class FeedParams(Params):
    page: int = 1


@endpoint(FeedParams, items=[FeedEntry], resources=["user_agent"], fetcher=FETCHER)
def feed(ctx: Context, p: FeedParams) -> Outputs:
    yield from feed_page(ctx, get_guarded(ctx, "/pc/feed", page=p.page), p.page)
