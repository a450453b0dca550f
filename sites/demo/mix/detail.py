"""demo mix: a post, `/mix/post/{pid}`, static or rendered as learnt."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import base_url, check_html
from sites.demo.items import Post
from sites.demo.markup import post_detail


class DetailParams(Params):
    post_id: str


@endpoint(DetailParams, items=[Post], resources=["user_agent"], render="auto")
def detail(ctx: Context, p: DetailParams) -> Outputs:
    resp = ctx.get(f"{base_url()}/mix/post/{p.post_id}", ok_statuses=(401, 403))
    check_html(resp)
    yield post_detail(resp)
