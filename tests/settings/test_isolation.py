"""The suite's shared fixture (tests/conftest.py) puts the process's settings and runtime
back after each test: the second test here sees what the first found, although the first
left its changes in place. The tests run in this order (pytest keeps a module's order)."""

from __future__ import annotations

import os

from config import get_settings, reset_settings
from lifecycle import runtime
from settings.proxy import ProxySettings

SEEN: dict[str, object] = {}


def test_a_test_that_leaves_the_settings_and_runtime_changed() -> None:
    SEEN["settings"] = get_settings()
    SEEN["refill"] = ProxySettings.current().refill_interval
    SEEN["prefix"] = get_settings().key_prefix
    os.environ["CHAINCRAWL_KEY_PREFIX"] = "leaked-by-a-test"
    os.environ["CHAINCRAWL_PROXY_REFILL_INTERVAL"] = "123"
    reset_settings()
    assert get_settings().key_prefix == "leaked-by-a-test"
    SEEN["installed"] = runtime.install(runtime.Runtime(get_settings(), 0))


def test_the_next_test_finds_them_as_the_first_did() -> None:
    assert "CHAINCRAWL_PROXY_REFILL_INTERVAL" not in os.environ
    assert get_settings() is SEEN["settings"] and get_settings().key_prefix == SEEN["prefix"]
    assert ProxySettings.current().refill_interval == SEEN["refill"] != 123
    assert runtime.current() is not SEEN["installed"]
    assert runtime.current().settings is SEEN["settings"]
