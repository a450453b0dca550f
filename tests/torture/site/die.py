"""`torture.local.die`: a task that takes its worker process down every time it runs.

`how="exit"` calls `os._exit(3)` (a C extension aborting, an OOM-kill); `how="kill"` sends
SIGKILL to its own process. Under the threads pool that is the whole worker; under prefork
it is the pool child. Each delivery first hits `/hit/{token}` so the test can count them.
"""

from __future__ import annotations

import os
import signal
from typing import ClassVar, Literal

from base_task import Context, Item, Outputs, Params, endpoint
from tests.torture.site import base_url


class DieParams(Params):
    how: Literal["exit", "kill"]
    token: str


class Never(Item):
    item_type: ClassVar[str] = "torture.never_die"
    key_fields: ClassVar[tuple[str, ...]] = ("token",)
    token: str


@endpoint(DieParams, items=[Never], name="torture.local.die")
def die(ctx: Context, p: DieParams) -> Outputs:
    ctx.get(f"{base_url()}/hit/{p.token}")
    if p.how == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
    yield Never(token=p.token)  # not reached


class MaybeDieParams(Params):
    token: str


@endpoint(MaybeDieParams, items=[Never], name="torture.local.maybe_die")
def maybe_die(ctx: Context, p: MaybeDieParams) -> Outputs:
    """Dies (`os._exit`) when its token starts with "die", else stores one item: a poison page
    among good ones, for batches."""
    ctx.get(f"{base_url()}/hit/{p.token}")
    if p.token.startswith("die"):
        os._exit(3)
    yield Never(token=p.token)
