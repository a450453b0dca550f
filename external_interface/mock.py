"""Test doubles for the fetch layer (after httpx's MockTransport): no network, no Redis.

    fetcher = FixtureFetcher({"/h5/api/feed": "tests/sites/demo/h5/fixtures/feed.json"})
    items, follows = run_endpoint("demo.h5.feed", {}, fetcher)

Parser tests feed an endpoint saved pages this way, the way a team tests a real site.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from exceptions import NotFound
from external_interface.fetch import FetchRequest, Response

_TYPES = {".json": "application/json", ".html": "text/html", ".htm": "text/html"}


class MockFetcher:
    """Answers every request with `handler(request)`; records what was asked."""

    def __init__(self, handler: Callable[[FetchRequest], Response]) -> None:
        self.handler = handler
        self.requests: list[FetchRequest] = []

    def fetch(self, req: FetchRequest) -> Response:
        self.requests.append(req)
        return self.handler(req)


class FixtureFetcher(MockFetcher):
    """Serves saved files by URL path (a regex matched against the path, or an exact path)."""

    def __init__(self, routes: Mapping[str, str | Path | bytes], status: int = 200) -> None:
        self.routes = [
            (re.compile(k if k.startswith("^") else re.escape(k) + "$"), v)
            for k, v in routes.items()
        ]
        self.status = status
        super().__init__(self._serve)

    def _serve(self, req: FetchRequest) -> Response:
        path = urlsplit(req.url).path
        for pattern, src in self.routes:
            if pattern.search(path):
                if isinstance(src, bytes):
                    body, ctype = src, "text/html"
                else:
                    p = Path(src)
                    body, ctype = p.read_bytes(), _TYPES.get(p.suffix, "text/plain")
                return Response(
                    url=req.url,
                    status=self.status,
                    headers={"content-type": ctype},
                    content=body,
                    elapsed=0.0,
                )
        raise NotFound(f"no fixture for {path}", status=404, url=req.url)
