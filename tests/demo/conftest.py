"""Fixtures for the demo platform tests: user agents, sessions and shared servers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from demo.testing import DemoServer

DESKTOP_UA = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/126.0 Safari/537.36"
)
MOBILE_UA = (
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.0 Mobile/15E148 Safari/604.1"
)
APP_UA = "DemoApp/3.2.1 (Android 14; Pixel 8)"


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


@pytest.fixture(scope="session")
def tiny_server() -> Iterator[DemoServer]:
    """No anti-crawl features; tests may read but must not rely on its counters."""
    with DemoServer(size="tiny") as server:
        yield server
