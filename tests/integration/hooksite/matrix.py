"""Site `hk`: one endpoint whose hooks answer, at the point and with the signal its `case`
names (`before_request-skip`, `after_store-retry`, ...), and continue everywhere else. A
`retry` is said once per case (a Redis counter), so the page then goes on; on_error cases
fail their first attempt with an error that would fail the page for good by itself."""

from __future__ import annotations

from typing import Any, ClassVar

from base_task import (
    Context,
    Item,
    ItemValidationError,
    Outputs,
    Params,
    StoredContext,
    after_response,
    after_store,
    before_request,
    before_store,
    endpoint,
    fail,
    on_error,
    retry,
    skip,
)
from config import get_settings
from tests.testsite import base_url
from utils.redis import get_redis


class CaseParams(Params):
    case: str


class CaseItem(Item):
    item_type: ClassVar[str] = "hk.case"
    key_fields: ClassVar[tuple[str, ...]] = ("case",)
    case: str
    title: str


def calls(point: str, case: str) -> int:
    """How many times the hooks of `point` were asked about `case` (this one included)."""
    return int(get_redis().incr(get_settings().key("hk", "calls", point, case)))


def answer(point: str, case: str) -> Any:
    if not case.startswith(point + "-"):
        return None
    n = calls(point, case)
    signal = case.removeprefix(point + "-").split(".")[0]  # a test tags its cases: "-skip.ab12"
    if signal == "skip":
        return skip(case)
    if signal == "retry":
        return retry(case) if n == 1 else None
    if signal == "fail":
        return fail(case)
    return None


@endpoint(CaseParams, items=[CaseItem], name="hk.local.page")
def page(ctx: Context, p: CaseParams) -> Outputs:
    if p.case.startswith("on_error-") and calls("page", p.case) == 1:
        raise ItemValidationError(f"{p.case}: the first attempt fails for good by itself")
    data = ctx.get(f"{base_url()}/detail/{p.case}").json()
    yield CaseItem(case=data["id"], title=data["title"])


@before_request(site="hk")
def hk_before_request(ctx: Context, req: Any) -> Any:
    return answer("before_request", ctx.params.case)  # type: ignore[attr-defined]


@after_response(site="hk")
def hk_after_response(ctx: Context, resp: Any) -> Any:
    return answer("after_response", ctx.params.case)  # type: ignore[attr-defined]


@before_store("hk.local.page")
def hk_before_store(ctx: Context, item: CaseItem) -> Any:
    return answer("before_store", item.case)


@after_store(site="hk")
def hk_after_store(ctx: StoredContext, item: dict[str, Any]) -> Any:
    out = answer("after_store", item["case"])
    if out is None:
        ctx.count(f"after:{item['case']}")
    return out


@after_store("hk.local.page")
def hk_after_store_next(ctx: StoredContext, item: dict[str, Any]) -> Any:
    """The next after_store hook: not called for an item the one before skipped."""
    ctx.count(f"after2:{item['case']}")


@on_error("hk.local.page")
def hk_on_error(ctx: Context | None, exc: BaseException) -> Any:
    return answer("on_error", ctx.params.case) if ctx is not None else None  # type: ignore[attr-defined]
