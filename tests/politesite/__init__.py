"""Endpoints that crawl tests/polite_site.py's site the way a user would crawl a real one:
the first step reads the sitemaps named in robots.txt, the second fetches each page. Loaded by
test workers through CHAINCRAWL_EXTRA_SITE_PACKAGES=tests.politesite."""

from __future__ import annotations

import os


def base_url() -> str:
    return os.environ.get("POLITESITE_URL", "http://127.0.0.1:1")
