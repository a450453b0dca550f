"""demo mix: the feed index, `/mix/feed?page=N`, static or rendered as learnt."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import base_url, check_html, need
from sites.demo.items import FeedEntry
from sites.demo.markup import feed_entries


class FeedParams(Params):
    page: int = 1


@endpoint(FeedParams, items=[FeedEntry], resources=["user_agent"], render="auto")
def feed(ctx: Context, p: FeedParams) -> Outputs:
    resp = ctx.get(f"{base_url()}/mix/feed", params={"page": p.page}, ok_statuses=(401, 403))
    check_html(resp)
    need(resp, ".pager .total-pages::text")  # the last element: the page is all there
    yield from feed_entries(resp)
    if resp.css(".pager a.next"):
        yield ctx.follow(page=p.page + 1)
