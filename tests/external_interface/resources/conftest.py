"""The pool, channel and provider tests here check Redis after each request: one checkout and
one return per request, as `hold_requests` 1 has it, so holding is off for them
(`holding.set_enabled`). Holding itself is tested in test_holding.py, which turns it on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from external_interface.resources import holding


@pytest.fixture(autouse=True)
def _one_checkout_per_request() -> Iterator[None]:
    holding.set_enabled(False)
    yield
    holding.set_enabled(True)
    holding.forget()
