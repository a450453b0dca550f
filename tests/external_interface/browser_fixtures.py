"""Fixtures for the browser tests: the JS demo front end and browser pools, always stopped.

Loaded by `tests/external_interface/conftest.py`. Tests that render are marked `needs_browser`
and skip, naming what to install, where Chromium or Playwright is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from demo.testing import DemoServer
from external_interface.browser import BrowserPool, PoolConfig
from external_interface.browser.check import find_executable, problems

MISSING = problems("")
needs_browser = pytest.mark.skipif(bool(MISSING), reason="; ".join(MISSING) or "browser present")

# small pages and batches, so a small demo (20 users) has several of each
JS_FEED_PAGE_SIZE = 7
JS_BATCH_SIZE = 3


def pool_config(**overrides: Any) -> PoolConfig:
    base = PoolConfig(
        executable=find_executable("") or "",
        contexts=2,
        context_pages=100,
        memory_mb=4000,
        timeout=30.0,
        queue_wait=10.0,
        block=("image", "font", "media"),
        idle_close=0,  # kept open: a test that wants the idle close asks for it
    )
    return replace(base, **overrides)


@pytest.fixture(scope="session")
def js_demo() -> Iterator[DemoServer]:
    """The demo platform (small: 20 users, 5 posts each) with small JS pages and batches."""
    with DemoServer(
        size="small", js_feed_page_size=JS_FEED_PAGE_SIZE, js_batch_size=JS_BATCH_SIZE
    ) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserPool]:
    """A pool of two contexts shared by a module's tests (its driver starts on first use)."""
    pool = BrowserPool(pool_config())
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def make_browser() -> Iterator[Callable[..., BrowserPool]]:
    """Pools with their own settings for one test, all closed at its end."""
    made: list[BrowserPool] = []

    def make(**overrides: Any) -> BrowserPool:
        pool = BrowserPool(pool_config(**overrides))
        made.append(pool)
        return pool

    try:
        yield make
    finally:
        for pool in made:
            pool.close()
