"""`render="auto"`: an endpoint's code run on a fetched page, a rendered one, or both.

`@endpoint(render="auto")` wraps the endpoint's function (`auto`). Each page asks the
pattern's decision at its first `ctx.get` (external_interface/fetch/adaptive.py): `http` runs
the function once over fetched pages, `render` once over rendered ones (every GET of the page
becomes `ctx.render`, waiting for `CHAINCRAWL_BROWSER_ADAPTIVE_WAIT`), and `sample` runs it
twice, fetched then rendered, compares what the two yielded and keeps the rendered page's
outputs. A fetched page that yields no item, or that its parser cannot read (`ParseError`),
where the pattern's samples had items is sampled at once. Offline (parser tests) the
function runs on what the test's fetcher answers, as any endpoint's.

Metrics: `adaptive_fetched`, `adaptive_rendered`, `adaptive_sampled`, `adaptive_changed` in
the endpoint's counts; the decisions with their evidence in `status`.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from exceptions import ItemValidationError, ParseError
from external_interface.fetch.adaptive import (
    HTTP,
    LEARNING,
    RENDER,
    SAMPLE,
    AdaptiveStore,
    Plan,
    Sample,
    fingerprint,
    items_in,
    url_pattern,
)
from settings.browser import get_browser_settings
from utils.redis import get_redis

log = logging.getLogger("chaincrawl.adaptive")

_stores: dict[tuple[int, str], AdaptiveStore] = {}
_lock = threading.Lock()
# a fetched page these raise for is a page the parser cannot read: evidence, not a failure
UNREADABLE = (ParseError, ItemValidationError)


def store_for(ctx: Any) -> AdaptiveStore:
    """This process's decision store for the context's state store."""
    s = ctx._settings
    client = get_redis(s.redis_url)
    key = (id(client), s.key_prefix)
    st = _stores.get(key)
    if st is None:
        with _lock:
            st = _stores.setdefault(key, AdaptiveStore(client, s.key_prefix))
    return st


class AutoPage:
    """One page of an adaptive endpoint: its plan, decided at its first GET, and whether the
    pass running now renders its GETs (`Context.request` asks `renders`)."""

    def __init__(self, endpoint: str, store: AdaptiveStore) -> None:
        self.endpoint, self.store = endpoint, store
        self.plan: Plan | None = None
        self.url = self.pattern = ""
        self.rendering = False
        self.wait_until = get_browser_settings().adaptive_wait

    def renders(self, url: str) -> bool:
        if self.plan is None:
            self.url, self.pattern = url, url_pattern(url)
            self.plan = self.store.plan(self.endpoint, self.pattern)
            self.rendering = self.plan.mode == RENDER
        return self.rendering


def auto(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The endpoint function of a `render="auto"` endpoint (module docstring)."""

    @functools.wraps(fn)
    def run(ctx: Any, params: Any) -> list[Any]:
        if not ctx._online:
            return list(fn(ctx, params) or ())
        return run_page(fn, ctx, params)

    return run


def run_page(fn: Callable[..., Any], ctx: Any, params: Any) -> list[Any]:
    page = AutoPage(ctx._spec.name, store_for(ctx))
    ctx._auto = page
    try:
        return _run(fn, ctx, params, page)
    finally:
        ctx._auto = None


def _run(fn: Callable[..., Any], ctx: Any, params: Any, page: AutoPage) -> list[Any]:
    first: list[Any] = []
    unreadable: BaseException | None = None
    try:
        first = list(fn(ctx, params) or ())
    except UNREADABLE as exc:
        if page.plan is None or page.plan.mode == RENDER:
            raise
        unreadable = exc
    plan = page.plan
    if plan is None:  # the page made no GET: nothing to decide
        if unreadable is not None:
            raise unreadable
        return first
    if plan.mode == RENDER:
        ctx.count("adaptive_rendered")
        return first
    suspect = False
    if plan.mode == HTTP:
        if unreadable is None and (items_in(fingerprint(first)) or not plan.sample_items):
            ctx.count("adaptive_fetched")
            return first
        suspect = True  # empty or unreadable where the samples had items: a changed page type?
    ctx.count("adaptive_sampled")
    page.rendering = True
    rendered = list(fn(ctx, params) or ())  # its failures are the page's
    a, b = fingerprint(first) if unreadable is None else [], fingerprint(rendered)
    same = unreadable is None and a == b
    missing, extra = len(set(b) - set(a)), len(set(a) - set(b))
    sample = Sample(
        page.url,
        same,
        items_in(a),
        items_in(b),
        missing,
        extra,
        f"{type(unreadable).__name__}: {unreadable}"[:200] if unreadable else "",
        suspect,
    )
    decided = page.store.record(page.endpoint, page.pattern, sample)
    if decided != plan.decision:
        if plan.decision != LEARNING:  # a decision reversed, not the first one made
            ctx.count("adaptive_changed")
        log.info(
            "%s %s: %s -> %s (%s)",
            page.endpoint,
            page.pattern,
            plan.decision,
            decided,
            sample.describe(),
        )
    return rendered


__all__ = ["SAMPLE", "AutoPage", "auto", "run_page"]
