"""The fetch layer's interface: a request (`FetchRequest`) and the one-method `Fetcher`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from external_interface.fetch.response import Response


@dataclass
class FetchRequest:
    method: str
    url: str
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None
    cookies: Mapping[str, str] | None = None
    data: Any = None
    json: Any = None
    proxy: str | None = None
    timeout: float = 20.0
    connect_timeout: float = 5.0
    max_bytes: int = 10 * 1024 * 1024
    allow_redirects: bool = True
    # never sent: which waiting request takes a freed fetch slot first (a gevent worker's
    # LimitedFetcher; the run's priority, lifecycle.runtime.Runtime.page_rank)
    rank: int = 0


class Fetcher(Protocol):
    """Send one request, return a fully read Response or raise a FetchError subclass."""

    def fetch(self, req: FetchRequest) -> Response: ...
