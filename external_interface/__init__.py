"""Adapters to the services a crawler leans on, one sub-package per part.

fetch/       the Fetcher interface, Response, the HTTP fetchers, the development HTTP
             cache, robots.txt, sitemaps, and the test doubles for parser tests
resources/   what is lent to each request: the provider interface, the lease-pool engine,
             cookies, device ids, user agents, signatures, captchas, accounts, ban rules,
             pool health, proxies
storage/     where items go: routing per item type, the sinks, the outbox drainer, export
dedup/       seen / changed / since when, per site and item type
browser/     rendered pages (Playwright on the system's Chromium)
"""
