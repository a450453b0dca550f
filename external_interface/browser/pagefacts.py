"""Small facts the driver reads off a render's request and Playwright's objects: which
renders may share a context, the cookies as Playwright takes them, the document's timing and
redirects, and the quiet clean-up steps. Playwright objects are typed `Any`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from typing import Any
from urllib.parse import urlsplit


def context_key(req: dict[str, Any]) -> tuple[Any, ...]:
    """Renders that may share a context: same proxy, user agent, cookie set, blocked types.
    Cookies and proxy credentials only enter as a digest."""
    secret = json.dumps([req.get("proxy"), sorted((req.get("cookies") or {}).items())])
    return (
        hashlib.sha256(secret.encode()).hexdigest(),
        req.get("user_agent") or "",
        tuple(sorted(req.get("block") or ())),
    )


def cookies_for(url: str, cookies: dict[str, str]) -> list[dict[str, Any]]:
    host = urlsplit(url).hostname or ""
    return [{"name": k, "value": v, "domain": host, "path": "/"} for k, v in cookies.items()]


def same_document(current: str, url: str) -> bool:
    """Whether navigating from `current` to `url` would stay in the same document (the two
    differ at most in their fragment)."""
    return (
        current != "about:blank"
        and current.split("#", 1)[0] == url.split("#", 1)[0]
        and ("#" in current or "#" in url)
    )


def document_seconds(resp: Any) -> float | None:
    """How long the main document took to arrive (request start to its last byte), the
    counterpart of a fetch's `elapsed`; None when the browser did not time it."""
    with contextlib.suppress(Exception):
        end = float(resp.request.timing.get("responseEnd", -1))
        if end > 0:
            return end / 1000
    return None


def history(resp: Any) -> list[str]:
    out = []
    r = resp.request.redirected_from
    while r is not None:
        out.append(r.url)
        r = r.redirected_from
    return out[::-1]


async def quietly(aw: Any, timeout: float) -> bool:
    """Await a clean-up step; False if it failed or took longer than `timeout`."""
    try:
        await asyncio.wait_for(aw, timeout)
        return True
    except Exception:
        return False


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:500]
