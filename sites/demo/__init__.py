"""Site demo: the local DemoNews platform (demo/README.md) through its three front ends.

pc serves HTML pages (user pages in GBK), h5 a JSON API with cursor paging, app a JSON API
with page/size paging. All three serve the same data, so their endpoints yield the same item
types (`sites/demo/items.py`) and a chain may mix front ends freely.

The helpers here turn the site's ways of saying "no" into typed errors once, so endpoint
modules only build a URL and parse: the login wall (a 200 page on pc, 401 on the APIs) raises
`LoginRequired`, the ban page `BannedError`, a page or envelope that does not look as
expected (a changed layout, a body cut short) `ParseError`; a value a page must have is read
with the framework's `base_task.need` / `need_int` (`ParseError` naming the query and URL).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from base_task import Context, Response
from exceptions import BannedError, LoginRequired, ParseError, error_for_status

# Statuses whose body we read before choosing the error: the ban and login-wall answers
# carry a code that says which resource to rotate.
_READ_BODY = (401, 403)


def base_url() -> str:
    """Where the demo platform lives; `DEMO_BASE_URL` points the crawl elsewhere."""
    return os.environ.get("DEMO_BASE_URL", "http://127.0.0.1:8700").rstrip("/")


def get_html(ctx: Context, path: str, **params: Any) -> Response:
    """A pc page, decoded by its declared charset, or the typed error for what came back."""
    resp = ctx.get(base_url() + path, params=params or None, ok_statuses=_READ_BODY)
    check_html(resp)
    return resp


def check_html(resp: Response) -> None:
    if resp.css(".login-wall") or (resp.css("form.login-form") and not resp.css("li.comment")):
        raise LoginRequired(f"login wall at {resp.url}")
    if resp.css("body.error-banned, .error[data-error=banned]"):
        msg = resp.css(".error .message::text").get("")
        raise _banned(f"ban page at {resp.url}: {msg}", resp.headers.get("retry-after"))
    if resp.status >= 400:
        raise error_for_status(resp.status, resp.url)


def get_api(ctx: Context, path: str, **params: Any) -> Any:
    """The `data` of an h5 (`{"ok": 1, ...}`) or app (`{"code": 0, ...}`) API answer."""
    resp = ctx.get(base_url() + path, params=params or None, ok_statuses=_READ_BODY)
    return unwrap(resp)


def unwrap(resp: Response) -> Any:
    body = resp.json()  # ParseError on a malformed or truncated body
    if not isinstance(body, dict):
        raise ParseError(f"{resp.url}: expected a JSON object, got {type(body).__name__}")
    error = body.get("error")
    if error == "login_required":
        raise LoginRequired(f"login required at {resp.url}")
    if error in ("banned", "device_banned"):
        raise _banned(f"{error} at {resp.url}: {body.get('message', '')}", body.get("retry_after"))
    if resp.status >= 400:
        raise error_for_status(resp.status, resp.url)
    if (body.get("ok") == 1 or body.get("code") == 0) and "data" in body:
        return body["data"]
    raise ParseError(f"{resp.url}: not a demo API envelope: {str(body)[:120]}")


def api_list(data: Any, *keys: str) -> list[dict[str, Any]]:
    """`data["list"]` of a list answer, checking the paging keys the endpoint reads."""
    if not isinstance(data, dict) or not isinstance(data.get("list"), list):
        raise ParseError(f"expected a list answer, got {str(data)[:120]}")
    missing = [k for k in keys if k not in data]
    if missing:
        raise ParseError(f"list answer lacks {missing}: {str(data)[:120]}")
    return data["list"]


def _banned(message: str, retry_after: Any) -> BannedError:
    """A BannedError whose retry waits out the ban the site announced (capped by the base)."""
    err = BannedError(message)
    with contextlib.suppress(TypeError, ValueError):
        err.retry_after = float(retry_after) if retry_after else None  # type: ignore[attr-defined]
    return err
