"""demo pc: the feed index, `/pc/feed?page=N`, one entry per user (that user's newest post)."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import get_html, need, need_int
from sites.demo.items import FeedEntry


class FeedParams(Params):
    page: int = 1


@endpoint(FeedParams, items=[FeedEntry], resources=["user_agent"])
def feed(ctx: Context, p: FeedParams) -> Outputs:
    resp = get_html(ctx, "/pc/feed", page=p.page)
    need(resp, ".pager .total-pages::text")  # the last element: the page arrived whole
    for row in resp.css("section.feed .feed-item"):
        yield FeedEntry(
            post_id=need(row, "::attr(data-pid)"),
            user_id=need(row, "::attr(data-uid)"),
            user_name=need(row, "a.user-link::text"),
            title=need(row, "a.post-link::text"),
            summary=row.css("p.summary::text").get(""),
            likes=need_int(row, ".likes::text"),
            comments_count=need_int(row, ".comments-count::text"),
            created_at=need_int(row, "time.created-at::attr(data-ts)"),
        )
    if resp.css(".pager a.next"):
        yield ctx.follow(page=p.page + 1)
