"""A development cache of HTTP responses on disk, so iterating on a parser sends no requests.

`CHAINCRAWL_HTTP_CACHE=DIR` (Scrapy's HTTPCACHE idea): while set, the fetch layer
(`fetch.CachingFetcher`) answers a GET from DIR when it holds the response, and stores the
response there when not. Unset (the default), nothing here is imported into the page path.

- Key: SHA-256 of the method, the canonical URL (query arguments sorted, fragment dropped,
  `params` merged in) and the values of `CHAINCRAWL_HTTP_CACHE_HEADERS` (default `Accept`,
  `Accept-Language`). Cookies, user agents, signatures and proxies are not part of it: they
  rotate per request, and the page they fetch is the same.
- Stored: every GET answered with a status below 500 other than 429 (a 404 is an answer;
  a 503 or a 429 is a moment). Requests that fail (timeouts, refused) are not stored.
- Layout: `DIR/<2 hex>/<key>.json` (status, headers, final URL, redirect history, what was
  asked) beside `<key>.body` (the decoded body), each written atomically; delete DIR, or one
  pair, to forget. `CHAINCRAWL_HTTP_CACHE_TTL` seconds bound an entry's age (0: forever).
- A response from the cache has `from_cache=True` and `elapsed=0.0`: it must not feed the
  adaptive throttle.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import urllib3
from w3lib.url import canonicalize_url

from config import Settings, get_settings
from external_interface.fetch.base import Fetcher, FetchRequest
from external_interface.fetch.response import Response, full_url, header_charset

CACHED_METHODS = frozenset(("GET",))


def storable(status: int) -> bool:
    """Whether an answer with this status is kept (answers, not moments: no 5xx, no 429)."""
    return status < 500 and status != 429


@dataclass
class CachedResponse:
    """What the cache keeps of one response."""

    url: str
    status: int
    headers: list[tuple[str, str]]
    content: bytes
    history: list[str] = field(default_factory=list)
    stored: float = 0.0


class HttpCache:
    """Responses on disk under `root`, keyed by request (module docstring)."""

    def __init__(
        self,
        root: str | Path,
        ttl: float = 0.0,
        headers: Iterable[str] = ("accept", "accept-language"),
    ) -> None:
        self.root = Path(root).expanduser()
        self.ttl = ttl
        self.headers = tuple(sorted({h.strip().lower() for h in headers if h.strip()}))

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> HttpCache | None:
        """The cache `CHAINCRAWL_HTTP_CACHE` names, or None when it is unset."""
        s = settings or get_settings()
        if not s.http_cache.strip():
            return None
        return cls(s.http_cache.strip(), s.http_cache_ttl, s.http_cache_headers.split(","))

    def key(
        self,
        method: str,
        url: str,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> str | None:
        """The request's key, or None when its method is never cached."""
        method = method.upper()
        if method not in CACHED_METHODS:
            return None
        lower = {k.lower(): v for k, v in (headers or {}).items()}
        parts = [method, canonicalize_url(full_url(url, params))]
        parts += [f"{h}:{lower.get(h, '')}" for h in self.headers]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def _paths(self, key: str) -> tuple[Path, Path]:
        folder = self.root / key[:2]
        return folder / f"{key}.json", folder / f"{key}.body"

    def get(self, key: str) -> CachedResponse | None:
        """The stored response, or None (absent, expired, or half written)."""
        meta_path, body_path = self._paths(key)
        try:
            meta = orjson.loads(meta_path.read_bytes())
            content = body_path.read_bytes()
        except (FileNotFoundError, orjson.JSONDecodeError):
            return None
        if self.ttl and time.time() - float(meta["stored"]) > self.ttl:
            return None
        if len(content) != meta["size"]:  # a body from another write than this metadata
            return None
        return CachedResponse(
            url=meta["url"],
            status=int(meta["status"]),
            headers=[(k, v) for k, v in meta["headers"]],
            content=content,
            history=list(meta["history"]),
            stored=float(meta["stored"]),
        )

    def put(self, key: str, resp: CachedResponse, request: Mapping[str, Any] | None = None) -> None:
        """Store a response (body first, then its metadata: a reader never sees a body
        without the metadata that matches it)."""
        meta_path, body_path = self._paths(key)
        meta_path.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "url": resp.url,
            "status": resp.status,
            "headers": resp.headers,
            "history": resp.history,
            "size": len(resp.content),
            "stored": resp.stored or time.time(),
            "request": dict(request or {}),
        }
        _write_atomic(body_path, resp.content)
        _write_atomic(meta_path, orjson.dumps(meta, option=orjson.OPT_INDENT_2))


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CachingFetcher:
    """GETs answered from the development HTTP cache when it holds them, stored when not
    (external_interface/fetch/cache.py). Outermost, so a cached answer takes no fetch slot."""

    def __init__(self, inner: Fetcher, cache: HttpCache) -> None:
        self.inner = inner
        self.cache = cache

    def lookup(self, req: FetchRequest) -> Response | None:
        """The stored answer to `req`, or None: a caller that finds one can skip the rate
        limits, the throttle and robots.txt too, as no request goes out."""
        key = self.cache.key(req.method, req.url, req.params, req.headers)
        hit = self.cache.get(key) if key is not None else None
        if hit is None:
            return None
        headers = urllib3.HTTPHeaderDict(hit.headers)
        return Response(
            url=hit.url,
            status=hit.status,
            headers=headers,
            content=hit.content,
            elapsed=0.0,
            declared_encoding=header_charset(headers.get("content-type", "")),
            history=hit.history,
            from_cache=True,
        )

    def fetch(self, req: FetchRequest) -> Response:
        key = self.cache.key(req.method, req.url, req.params, req.headers)
        if key is None:
            return self.inner.fetch(req)
        hit = self.lookup(req)
        if hit is not None:
            return hit
        resp = self.inner.fetch(req)
        if storable(resp.status) and not resp.from_cache:
            entry = CachedResponse(
                resp.url, resp.status, list(resp.headers.items()), resp.content, list(resp.history)
            )
            self.cache.put(key, entry, {"method": req.method, "url": req.url})
        return resp
