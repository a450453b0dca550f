"""demo secure: a post through the guarded front."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo.items import Post
from sites.demo.markup import post_detail
from sites.demo.secure import FETCHER, get_guarded


class DetailParams(Params):
    post_id: str


@endpoint(DetailParams, items=[Post], resources=["user_agent"], fetcher=FETCHER)
def detail(ctx: Context, p: DetailParams) -> Outputs:
    yield post_detail(get_guarded(ctx, f"/pc/post/{p.post_id}"))
