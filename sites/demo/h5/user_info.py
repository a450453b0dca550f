"""demo h5: a user's profile, `/h5/api/user/{uid}`."""

from __future__ import annotations

from base_task import Context, Outputs, Params, endpoint
from sites.demo import get_api
from sites.demo.items import User


class UserInfoParams(Params):
    user_id: str


@endpoint(UserInfoParams, items=[User], resources=["user_agent"])
def user_info(ctx: Context, p: UserInfoParams) -> Outputs:
    yield User.from_api(get_api(ctx, f"/h5/api/user/{p.user_id}"))
