"""The fetch layer: one-method `Fetcher` interface, a pycurl default, typed errors.

    base.py      FetchRequest, the Fetcher interface
    response.py  what every fetcher shares: the URL's query, the body's encoding, error text
                 without credentials, the default User-Agent; Response (text, json, css,
                 xpath on demand), charset decoding that counts
    http.py      Urllib3Fetcher, RequestsFetcher
    impersonate.py  ImpersonateFetcher: a browser's TLS handshake, HTTP/2 and headers (curl_cffi)
    curl.py      CurlFetcher (the default): the contract on pycurl, the least CPU per request
    curl_gevent.py  pycurl's transfers on a gevent hub: one CurlMulti driven by its loop
    libcurl.py   what the two libcurl fetchers share: options, callbacks, error codes
    profiles.py  browser identities: the user agent's browser, its target and headers in order
    select.py    fetchers by name, the per-process set, the per-endpoint/site choice,
                 default_fetcher
    limits.py    LimitedFetcher: fetch slots per process, the most urgent run first
    cache.py     the development HTTP cache on disk (HttpCache) and CachingFetcher
    robots.py    robots.txt per origin (RobotsPolicy)
    sitemap.py   URLs from a site's sitemaps
    mock.py      test doubles: fixture fetchers and recorded cases for parser tests

`CurlFetcher` (the default), `Urllib3Fetcher`, `RequestsFetcher` and `ImpersonateFetcher`
keep the same contract and raise the same typed errors; pycurl costs the least CPU per request,
urllib3 directly about a third less than requests on top of it (docs/performance.md).
`CHAINCRAWL_FETCHER=urllib3` or `requests` chooses another for every request; an endpoint's `fetcher="impersonate"` (or `CHAINCRAWL_FETCHER_<SITE>`) sends
as a browser (docs/browser.md).

Timeouts are enforced here rather than left to Celery, because Celery's time limits do not
fire under the threads and gevent pools. Every request gets `min(request_timeout, time left
in the task)` as a *whole-request* deadline: the connect and read timeouts bound each socket
operation, and the body is read in chunks with the clock checked between them, so a server
that drips one byte a second cannot hold a worker slot past the deadline. The same loop
enforces the response size limit.
"""

from external_interface.fetch.base import Fetcher, FetchRequest
from external_interface.fetch.cache import CachingFetcher
from external_interface.fetch.curl import CurlFetcher
from external_interface.fetch.http import RequestsFetcher, Urllib3Fetcher
from external_interface.fetch.impersonate import ImpersonateFetcher
from external_interface.fetch.limits import LimitedFetcher
from external_interface.fetch.response import Response, decode_counting, header_charset, lazy
from external_interface.fetch.select import FetcherSet, choose, default_fetcher

__all__ = [
    "CachingFetcher",
    "CurlFetcher",
    "FetchRequest",
    "Fetcher",
    "FetcherSet",
    "ImpersonateFetcher",
    "LimitedFetcher",
    "RequestsFetcher",
    "Response",
    "Urllib3Fetcher",
    "choose",
    "decode_counting",
    "default_fetcher",
    "header_charset",
    "lazy",
]
