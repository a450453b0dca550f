"""Fetches a path template (`/flaky/{entry_id}?fails=2`): flaky, failing, slow pages;
`as_json` parses the body as JSON (`/malformed`: a 200 whose JSON is broken)."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.testsite import base_url


class ProbeParams(Params):
    path: str
    entry_id: str = ""
    as_json: bool = False


class ProbeResult(Item):
    item_type: ClassVar[str] = "testsite.probe"
    key_fields: ClassVar[tuple[str, ...]] = ("path",)
    path: str
    size: int


@endpoint(ProbeParams, items=[ProbeResult], name="testsite.local.probe", max_retries=2)
def probe(ctx: Context, p: ProbeParams) -> Outputs:
    path = p.path.format(entry_id=p.entry_id)
    resp = ctx.get(f"{base_url()}{path}")
    if p.as_json:
        resp.json()
    yield ProbeResult(path=path, size=len(resp.content))
