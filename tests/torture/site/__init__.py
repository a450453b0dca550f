"""Small endpoints that meet bad input on purpose, for the torture suite (`tests/torture`).

Loaded by torture workers through `CHAINCRAWL_EXTRA_SITE_PACKAGES=tests.testsite,tests.torture.site`;
their site is `torture`, so they run on the `torture` queue. They fetch from the bad-pages
server of `tests/torture/badsite.py` (`TORTURE_SITE_URL`). Not a user site.
"""

from __future__ import annotations

import os


def base_url() -> str:
    return os.environ.get("TORTURE_SITE_URL", "http://127.0.0.1:1").rstrip("/")
