"""demo h5: a post with its full content, `/h5/api/post/{pid}`."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import get_api
from sites.demo.items import Post


class DetailParams(Params):
    post_id: str


@endpoint(DetailParams, items=[Post], resources=["user_agent"])
def detail(ctx: Context, p: DetailParams) -> Outputs:
    yield Post.from_api(get_api(ctx, f"/h5/api/post/{p.post_id}"))
