"""demo app: a user's posts, newest first, `/app/api/user_statuses?user_id=&page=&size=`."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import api_list, get_api
from sites.demo.items import StatusEntry


class UserStatusesParams(Params):
    user_id: str
    page: int = 1
    size: int = 20


@endpoint(UserStatusesParams, items=[StatusEntry], resources=["user_agent", "device_id", "sign"])
def user_statuses(ctx: Context, p: UserStatusesParams) -> Outputs:
    q = {"user_id": p.user_id, "page": p.page, "size": p.size}
    data = get_api(ctx, "/app/api/user_statuses", **q)
    for post in api_list(data, "has_more"):
        yield StatusEntry.from_api(post)
    if data["has_more"]:
        yield ctx.follow(page=p.page + 1)
