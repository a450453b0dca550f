"""demo pc: a post, `/pc/post/{pid}`; its paragraphs joined by newlines are the API's content."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import get_html
from sites.demo.items import Post
from sites.demo.markup import post_detail


class DetailParams(Params):
    post_id: str


@endpoint(DetailParams, items=[Post], resources=["user_agent"])
def detail(ctx: Context, p: DetailParams) -> Outputs:
    yield post_detail(get_html(ctx, f"/pc/post/{p.post_id}"))
