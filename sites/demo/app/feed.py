"""demo app: the feed, `/app/api/feed?page=&size=`, one entry per user."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import api_list, get_api
from sites.demo.items import FeedEntry


class FeedParams(Params):
    page: int = 1
    size: int = 20  # the site clamps it to app_max_size (50)


@endpoint(FeedParams, items=[FeedEntry], resources=["user_agent", "device_id", "sign"])
def feed(ctx: Context, p: FeedParams) -> Outputs:
    data = get_api(ctx, "/app/api/feed", page=p.page, size=p.size)
    for entry in api_list(data, "has_more"):
        yield FeedEntry.from_api(entry)
    if data["has_more"]:
        yield ctx.follow(page=p.page + 1)
