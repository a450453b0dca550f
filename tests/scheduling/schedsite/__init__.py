"""Endpoints over the scheduling test server (tests/scheduling/server.py), loaded by test
workers through CHAINCRAWL_EXTRA_SITE_PACKAGES=tests.scheduling.schedsite."""

from __future__ import annotations

import os


def base_url() -> str:
    return os.environ.get("SCHEDSITE_URL", "http://127.0.0.1:1")
