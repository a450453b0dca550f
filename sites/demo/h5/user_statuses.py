"""demo h5: a user's posts, newest first, `/h5/api/user/{uid}/statuses?cursor=`."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import api_list, get_api
from sites.demo.items import StatusEntry


class UserStatusesParams(Params):
    user_id: str
    cursor: str = ""


@endpoint(UserStatusesParams, items=[StatusEntry], resources=["user_agent"])
def user_statuses(ctx: Context, p: UserStatusesParams) -> Outputs:
    q = {"cursor": p.cursor} if p.cursor else {}
    data = get_api(ctx, f"/h5/api/user/{p.user_id}/statuses", **q)
    for post in api_list(data, "next_cursor"):
        yield StatusEntry.from_api(post)
    if data["next_cursor"]:
        yield ctx.follow(cursor=data["next_cursor"])
