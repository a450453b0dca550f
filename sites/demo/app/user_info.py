"""demo app: a user's profile, `/app/api/user_info?user_id=`."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import get_api
from sites.demo.items import User


class UserInfoParams(Params):
    user_id: str


@endpoint(UserInfoParams, items=[User], resources=["user_agent", "device_id", "sign"])
def user_info(ctx: Context, p: UserInfoParams) -> Outputs:
    yield User.from_api(get_api(ctx, "/app/api/user_info", user_id=p.user_id))
