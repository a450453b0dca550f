"""demo js: a post, `/js/post/{pid}`, rendered until its script has drawn the inline data.

(A plain fetch could read the `window.__DATA__` script block instead, at a fraction of the
cost: docs/browser.md. This endpoint shows a rendered detail page.)"""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo.items import Post
from sites.demo.js import render
from sites.demo.markup import post_detail


class DetailParams(Params):
    post_id: str


@endpoint(DetailParams, items=[Post], resources=["browser", "user_agent"])
def detail(ctx: Context, p: DetailParams) -> Outputs:
    yield post_detail(render(ctx, f"/js/post/{p.post_id}", "article[data-state=ready]"))
