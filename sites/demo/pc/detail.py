"""demo pc: a post, `/pc/post/{pid}`; its paragraphs joined by newlines are the API's content."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import get_html, need, need_int
from sites.demo.items import Post


class DetailParams(Params):
    post_id: str


@endpoint(DetailParams, items=[Post], resources=["user_agent"])
def detail(ctx: Context, p: DetailParams) -> Outputs:
    resp = get_html(ctx, f"/pc/post/{p.post_id}")
    art = resp.css("article.post-detail")
    need(art, "a.comments-link::attr(href)")  # the article's last element: it arrived whole
    paragraphs = art.css(".post-content p::text").getall()
    yield Post(
        post_id=need(art, "::attr(data-pid)"),
        user_id=need(art, "::attr(data-uid)"),
        user_name=need(art, ".meta a.user-link::text"),
        title=need(art, "h1.title::text"),
        summary=paragraphs[0] if paragraphs else "",
        content="\n".join(paragraphs),
        likes=need_int(art, ".meta .likes::text"),
        comments_count=need_int(art, ".meta .comments-count::text"),
        created_at=need_int(art, ".meta time.created-at::attr(data-ts)"),
    )
