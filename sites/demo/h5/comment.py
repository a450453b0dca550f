"""demo h5: a post's comments, oldest first, `/h5/api/post/{pid}/comments?cursor=`
(401 login_required -> LoginRequired when the site's `login` feature is on)."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import api_list, get_api
from sites.demo.items import Comment


class CommentParams(Params):
    post_id: str
    cursor: str = ""


@endpoint(CommentParams, items=[Comment], resources=["user_agent", "cookie"])
def comment(ctx: Context, p: CommentParams) -> Outputs:
    q = {"cursor": p.cursor} if p.cursor else {}
    data = get_api(ctx, f"/h5/api/post/{p.post_id}/comments", **q)
    for c in api_list(data, "next_cursor"):
        yield Comment.from_api(c)
    if data["next_cursor"]:
        yield ctx.follow(cursor=data["next_cursor"])
