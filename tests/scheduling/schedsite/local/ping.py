"""One fast request per task: the rate-limit and priority tests count these server-side."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.scheduling.schedsite import base_url


class PingParams(Params):
    tag: str = ""
    n: int = 0


class Pong(Item):
    item_type: ClassVar[str] = "sched.pong"
    key_fields: ClassVar[tuple[str, ...]] = ("tag", "n")
    tag: str
    n: int


@endpoint(PingParams, items=[Pong], name="sched.local.ping")
def ping(ctx: Context, p: PingParams) -> Outputs:
    ctx.get(f"{base_url()}/ping", params={"tag": p.tag, "n": p.n})
    yield Pong(tag=p.tag, n=p.n)
