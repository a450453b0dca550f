"""demo app: a post with its full content, `/app/api/detail?post_id=`."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import get_api
from sites.demo.items import Post


class DetailParams(Params):
    post_id: str


@endpoint(DetailParams, items=[Post], resources=["user_agent", "device_id", "sign"])
def detail(ctx: Context, p: DetailParams) -> Outputs:
    yield Post.from_api(get_api(ctx, "/app/api/detail", post_id=p.post_id))
