"""demo mix: the feed index, `/mix/feed?page=N`, static or rendered as learnt."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import base_url, check_html
from sites.demo.items import FeedEntry
from sites.demo.markup import feed_page


class FeedParams(Params):
    page: int = 1


@endpoint(FeedParams, items=[FeedEntry], resources=["user_agent"], render="auto")
def feed(ctx: Context, p: FeedParams) -> Outputs:
    resp = ctx.get(f"{base_url()}/mix/feed", params={"page": p.page}, ok_statuses=(401, 403))
    check_html(resp)
    yield from feed_page(ctx, resp, p.page)
