"""One slow request per task: the concurrency-cap, lease and periodic tests hold these open."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.scheduling.schedsite import base_url


class SlowParams(Params):
    tag: str = ""
    n: int = 0
    s: float = 0.3


class SlowDone(Item):
    item_type: ClassVar[str] = "sched.slow"
    key_fields: ClassVar[tuple[str, ...]] = ("tag", "n")
    tag: str
    n: int


@endpoint(SlowParams, items=[SlowDone], name="sched.local.slow")
def slow(ctx: Context, p: SlowParams) -> Outputs:
    ctx.get(f"{base_url()}/slow", params={"tag": p.tag, "n": p.n, "s": p.s})
    yield SlowDone(tag=p.tag, n=p.n)
