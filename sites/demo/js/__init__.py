"""demo js: pages a script fills in after load, rendered in the worker's browser.

The js front end (demo/README.md, section 4a) sends pages without their entries: a script
fetches them from `/js/api/feed` (a list page, a "load more" button, an infinite scroll) or
draws them from an inline `window.__DATA__` (a post). Its endpoints ask for the browser
(`resources=["browser", ...]`), render the page until the script says it is done, and parse
the pc markup the script drew, or the page's own API answers captured on the way.

The script marks its progress on the list: `.feed[data-state=...]` is `loading`, then `ready`,
`more` or `done`, or `error` when its API answered an error. Waiting for any settled state
and reading `error` as the API's typed error retries a failed page at once, where waiting for
entries that never come would cost the whole render timeout.
"""

from __future__ import annotations

import re
from typing import Any

from base_task import Context, ParseError, error_for_status
from external_interface.browser import RenderedPage
from sites.demo import base_url, check_html

FEED_SETTLED = ", ".join(f".feed[data-state={s}]" for s in ("ready", "more", "done", "error"))
RENDER_TIMEOUT = 20.0  # a render takes 1-3 s on a busy machine; a stuck one is retried sooner
_HTTP_STATUS = re.compile(r"HTTP (\d{3})")


def render(ctx: Context, path: str, wait_for: str, **kw: Any) -> RenderedPage:
    """The rendered page at `path`, or the typed error of what the page or its script got."""
    page = ctx.render(
        base_url() + path, wait_for=wait_for, timeout=RENDER_TIMEOUT, ok_statuses=(401, 403), **kw
    )
    check_html(page)  # ban and login pages, then the status
    script_failed(page)
    return page


def script_failed(page: RenderedPage) -> None:
    """Raise what the page's script met: its API's status (`HTTP 503 from ...`), else a
    ParseError (an answer cut short)."""
    if not page.css(".feed[data-state=error]"):
        return
    msg = " ".join(page.css(".feed p.error::text").getall()).strip()
    m = _HTTP_STATUS.search(msg)
    if m:
        raise error_for_status(int(m.group(1)), page.url)
    raise ParseError(f"{page.url}: the page's script failed: {msg[:200]}")
