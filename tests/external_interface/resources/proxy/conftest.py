"""The proxy tests here check a channel's state after each request: one checkout and one
return per request, as `hold_requests` 1 has it. Holding (several requests per checkout) is
tested in tests/external_interface/resources/test_holding.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from external_interface.resources import holding
from external_interface.resources.pool import reset_pool_config


@pytest.fixture(autouse=True)
def _one_checkout_per_request(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CHAINCRAWL_POOL_PROXY", '{"hold_requests": 1}')
    reset_pool_config()
    yield
    reset_pool_config()
    holding.forget()
