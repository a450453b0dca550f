"""A small controllable site and its endpoints, loaded by test workers through
CHAINCRAWL_EXTRA_SITE_PACKAGES=tests.testsite. Not shipped as a user site."""

from __future__ import annotations

import os


def base_url() -> str:
    return os.environ.get("TESTSITE_URL", "http://127.0.0.1:1")
