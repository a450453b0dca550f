"""demo pc: a user's posts, newest first, from the GBK user page `/pc/user/{uid}?page=N`.

The page carries the profile too, so page 1 also yields the `demo.user` item: a pc chain gets
users and their posts from one request per page (no separate user_info step needed).
"""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint, need, need_int
from sites.demo import get_html
from sites.demo.items import StatusEntry, User
from sites.demo.pc.user_info import parse_profile


class UserStatusesParams(Params):
    user_id: str
    page: int = 1


@endpoint(UserStatusesParams, items=[User, StatusEntry], resources=["user_agent"])
def user_statuses(ctx: Context, p: UserStatusesParams) -> Outputs:
    resp = get_html(ctx, f"/pc/user/{p.user_id}", page=p.page)
    need(resp, ".pager .total-pages::text")
    user = parse_profile(resp)
    if p.page == 1:
        yield user
    for row in resp.css("ul.post-list li.post-item"):
        yield StatusEntry(
            post_id=need(row, "::attr(data-pid)"),
            user_id=user.user_id,
            title=need(row, "a.post-link::text"),
            likes=need_int(row, ".likes::text"),
            created_at=need_int(row, "time.created-at::attr(data-ts)"),
        )
    if resp.css(".pager a.next"):
        yield ctx.follow(page=p.page + 1)
