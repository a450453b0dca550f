"""Unit tests see the test site's endpoints too (no servers are started here)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _testsite_endpoints() -> None:
    import sites
    from config import get_settings, reset_settings

    if "tests.testsite" not in get_settings().extra_site_packages:
        os.environ["CHAINCRAWL_EXTRA_SITE_PACKAGES"] = "tests.testsite"
        reset_settings()
    sites.load_all()
