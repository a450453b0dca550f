"""Endpoints and hooks for the hook tests, loaded by test workers through
CHAINCRAWL_EXTRA_SITE_PACKAGES=tests.integration.hooksite.

    matrix.py    site `hk`: every signal at every hook point, chosen by the page's `case`
    news.py      site `news`: the three documented examples (docs/hooks.md), on the demo
                 platform's h5 API
"""
