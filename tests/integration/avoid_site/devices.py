"""A test-site page fetched with a device from the `device_id:testsite` pool: `/flaky/{key}`
answers 503 `fails` times, so the retry has that device in its `avoid` list (tests/integration/test_avoid_starvation.py)."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.testsite import base_url


class FlakyParams(Params):
    key: str
    fails: int = 1


class FlakyPage(Item):
    item_type: ClassVar[str] = "testsite.flaky_page"
    key_fields: ClassVar[tuple[str, ...]] = ("key",)
    key: str
    value: str


@endpoint(FlakyParams, items=[FlakyPage], name="testsite.avoid.flaky", resources=["device_id"])
def flaky(ctx: Context, p: FlakyParams) -> Outputs:
    data = ctx.get(f"{base_url()}/flaky/{p.key}?fails={p.fails}").json()
    yield FlakyPage(key=p.key, value=data["value"])
