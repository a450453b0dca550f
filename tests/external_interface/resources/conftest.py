"""The pool, channel and provider tests here check Redis after each request: one checkout and
one return per request, as `hold_requests` 1 has it, so holding is off for them
(`holding.set_enabled`). Holding itself is tested in test_holding.py, which turns it on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from config import reset_settings
from external_interface.resources import holding


@pytest.fixture(autouse=True)
def _one_checkout_per_request() -> Iterator[None]:
    holding.set_enabled(False)
    yield
    holding.set_enabled(True)
    holding.forget()


@pytest.fixture
def one_part(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pools of one part (`CHAINCRAWL_POOL_PARTS=1`): for tests of an order across a whole
    pool (least used first, least recently used first), which holds within a sub-pool."""
    monkeypatch.setenv("CHAINCRAWL_POOL_PARTS", "1")
    reset_settings()
    yield
    monkeypatch.delenv("CHAINCRAWL_POOL_PARTS")
    reset_settings()
