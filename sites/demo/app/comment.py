"""demo app: a post's comments, oldest first, `/app/api/comments?post_id=&page=&size=`
(401 login_required -> LoginRequired when the site's `login` feature is on)."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import api_list, get_api
from sites.demo.items import Comment


class CommentParams(Params):
    post_id: str
    page: int = 1
    size: int = 20


@endpoint(CommentParams, items=[Comment], resources=["user_agent", "device_id", "sign", "cookie"])
def comment(ctx: Context, p: CommentParams) -> Outputs:
    q = {"post_id": p.post_id, "page": p.page, "size": p.size}
    data = get_api(ctx, "/app/api/comments", **q)
    for c in api_list(data, "has_more"):
        yield Comment.from_api(c)
    if data["has_more"]:
        yield ctx.follow(page=p.page + 1)
