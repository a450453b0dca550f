"""Fixtures shared by the fetch layer's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.testsite.server import TestSite


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    """The local test site (listing, detail, drip, big, gbk, ...) on a free port."""
    s = TestSite()
    s.start()
    yield s
    s.stop()
