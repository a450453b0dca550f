"""Benchmark endpoints (site `benchsite`), loaded by workers with
`CHAINCRAWL_EXTRA_SITE_PACKAGES=bench.site`. Not part of any production crawl; seeds carry
absolute URLs of the demo server under test."""
