"""Two sites sharing one fleet budget (tests/scheduling/test_fleet_workers.py): the same slow
request under the names of sites `alpha` and `beta`, each on its site's queue."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.scheduling.schedsite import base_url


class WorkParams(Params):
    tag: str = ""
    n: int = 0
    s: float = 0.5


class Worked(Item):
    item_type: ClassVar[str] = "sched.worked"
    key_fields: ClassVar[tuple[str, ...]] = ("tag", "n")
    tag: str
    n: int


def _work(ctx: Context, p: WorkParams) -> Outputs:
    ctx.get(f"{base_url()}/slow", params={"tag": p.tag, "n": p.n, "s": p.s})
    yield Worked(tag=p.tag, n=p.n)


alpha = endpoint(WorkParams, items=[Worked], name="alpha.local.work")(_work)
beta = endpoint(WorkParams, items=[Worked], name="beta.local.work")(_work)
