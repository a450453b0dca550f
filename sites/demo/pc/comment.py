"""demo pc: a post's comments, oldest first, `/pc/post/{pid}/comments?page=N`.

Behind a login when the site's `login` feature is on: the wall answers 200, so `get_html`
recognises it from the body and raises LoginRequired (the cookie provider rotates sessions).
"""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint, need, need_int
from sites.demo import get_html
from sites.demo.items import Comment


class CommentParams(Params):
    post_id: str
    page: int = 1


@endpoint(CommentParams, items=[Comment], resources=["user_agent", "cookie"])
def comment(ctx: Context, p: CommentParams) -> Outputs:
    resp = get_html(ctx, f"/pc/post/{p.post_id}/comments", page=p.page)
    need(resp, ".pager .total-pages::text")
    post_id = need(resp, "section.comments::attr(data-pid)")
    for row in resp.css("ul.comment-list li.comment"):
        yield Comment(
            comment_id=need(row, "::attr(data-cid)"),
            post_id=post_id,
            user_id=need(row, "::attr(data-uid)"),
            user_name=need(row, "a.user-link::text"),
            text=row.css("span.text::text").get(""),
            likes=need_int(row, ".likes::text"),
            created_at=need_int(row, "time.created-at::attr(data-ts)"),
        )
    if resp.css(".pager a.next"):
        yield ctx.follow(page=p.page + 1)
