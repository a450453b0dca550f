"""demo h5: the feed, `/h5/api/feed?cursor=`, one entry per user (that user's newest post)."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import api_list, get_api
from sites.demo.items import FeedEntry


class FeedParams(Params):
    cursor: str = ""  # opaque; empty for the first page


@endpoint(FeedParams, items=[FeedEntry], resources=["user_agent"])
def feed(ctx: Context, p: FeedParams) -> Outputs:
    q = {"cursor": p.cursor} if p.cursor else {}
    data = get_api(ctx, "/h5/api/feed", **q)
    for entry in api_list(data, "next_cursor"):
        yield FeedEntry.from_api(entry)
    if data["next_cursor"]:
        yield ctx.follow(cursor=data["next_cursor"])
