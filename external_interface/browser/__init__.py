"""Rendering pages in a real browser: a bounded, recycled, crash-proof pool per worker process.

    from external_interface.browser import LoadMore, RenderRequest, get_pool

    result = get_pool().render(RenderRequest(
        "http://127.0.0.1:8700/js/more", wait_for=".feed-item",
        actions=[LoadMore("button.load-more", item=".feed-item")],
        capture_json=r"/js/api/feed", proxy=lent_proxy, cookies=lent_cookies, user_agent=ua,
    ))
    result.response.css(".feed-item")      # the rendered DOM, as a fetch.Response
    result.json_answers()                  # the page's own JSON answers, in arrival order

Endpoints render through `ctx.render(url, ...)` (lifecycle/context.py), which lends the
endpoint's resources to the page and returns `result.page()`: a `RenderedPage`, one Response
of the DOM that also carries the captured answers.

Modules: `model` (requests, actions, results), `pool` (the worker side: `BrowserPool`,
`get_pool`), `driver` (the process that owns Playwright and Chromium; its docstring says why
it is a process), `actions` (the page actions), `wire` (the frames between the two),
`procmem` (the browser's processes and memory), `check` (what to install when rendering
cannot work). Playwright is imported by the driver process only.
"""

from __future__ import annotations

from external_interface.browser.model import (
    Action,
    Click,
    LoadMore,
    RenderedPage,
    RenderRequest,
    RenderResult,
    ScrollToEnd,
    Wait,
    WaitFor,
)
from external_interface.browser.pool import BrowserPool, PoolConfig, get_pool, render

__all__ = [
    "Action",
    "BrowserPool",
    "Click",
    "LoadMore",
    "PoolConfig",
    "RenderRequest",
    "RenderResult",
    "RenderedPage",
    "ScrollToEnd",
    "Wait",
    "WaitFor",
    "get_pool",
    "render",
]
