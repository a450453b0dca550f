"""Fixtures shared by the external_interface tests."""

from __future__ import annotations

from tests.external_interface.browser_fixtures import (  # noqa: F401 - fixtures
    browser,
    js_demo,
    make_browser,
)
from tests.external_interface.proxy_fixtures import (  # noqa: F401 - fixtures
    pool,
    proxies,
    proxy_farm,
    proxy_settings,
    target_site,
)
from tests.external_interface.stores import store_url  # noqa: F401 - fixture
