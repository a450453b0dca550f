"""demo pc: a user's profile, from page 1 of the GBK user page `/pc/user/{uid}`."""

from __future__ import annotations

from typing import Any

from base_task import Context, Outputs, Params, endpoint, need, need_int
from sites.demo import get_html
from sites.demo.items import User


class UserInfoParams(Params):
    user_id: str


def parse_profile(resp: Any) -> User:
    """The profile block every user page carries (shared with user_statuses)."""
    prof = resp.css("div.profile")
    return User(
        user_id=need(prof, "::attr(data-uid)"),
        name=need(prof, "h1.name::text"),
        bio=prof.css("p.bio::text").get(""),
        location=prof.css(".location::text").get(""),
        followers=need_int(prof, ".followers::text"),
        post_count=need_int(prof, ".post-count::text"),
        verified=bool(prof.css(".verified")),
    )


@endpoint(UserInfoParams, items=[User], resources=["user_agent"])
def user_info(ctx: Context, p: UserInfoParams) -> Outputs:
    resp = get_html(ctx, f"/pc/user/{p.user_id}")
    need(resp, ".pager .total-pages::text")
    yield parse_profile(resp)
