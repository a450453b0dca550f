"""Proxy addresses, request outcomes and haipproxy's score arithmetic, free of any I/O.

The pure `next_score` is the specification the Lua script of the global pool (`pool.lua`) must
match; tests compare the two step by step.
"""

from __future__ import annotations

import enum
import socket
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

import exceptions as cc

SCHEMES = ("http", "https")


@dataclass(frozen=True)
class ProxyAddress:
    """A proxy URL split into its parts. `id` and `redacted` never carry credentials."""

    host: str
    port: int
    scheme: str = "http"
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, text: str) -> ProxyAddress:
        """Accept `host:port`, `http://host:port` or `http://user:pass@host:port`."""
        text = text.strip()
        if "://" not in text:
            text = "http://" + text
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            raise ValueError(f"unsupported proxy scheme {scheme!r}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or not port:
            # never echo the text: it may hold a password
            raise ValueError("proxy address needs a host and a port")
        return cls(
            host=parts.hostname,
            port=port,
            scheme=scheme,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )

    @property
    def id(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The full URL to hand to an HTTP client (credentials included, percent-encoded)."""
        auth = ""
        if self.username is not None:
            auth = quote(self.username, safe="")
            if self.password is not None:
                auth += ":" + quote(self.password, safe="")
            auth += "@"
        return f"{self.scheme}://{auth}{self.host}:{self.port}"

    @property
    def redacted(self) -> str:
        auth = "***@" if self.username is not None else ""
        return f"{self.scheme}://{auth}{self.host}:{self.port}"

    def __repr__(self) -> str:  # keep passwords out of tracebacks and logs
        return f"ProxyAddress({self.redacted!r})"

    __str__ = __repr__


def redact(url: str) -> str:
    """A proxy URL safe for logs; unparseable text becomes a placeholder."""
    try:
        return ProxyAddress.parse(url).redacted
    except ValueError:
        return "<proxy>"


class Event(enum.Enum):
    """What one request or validation says about a proxy."""

    SUCCESS = "success"  # answered: +1, or +round(10/score, 2) from 10 on
    TIMEOUT = "timeout"  # too slow: -1, removed at 0
    DEAD = "dead"  # refused / proxy error / bad credentials: removed at once
    BANNED = "banned"  # this site blocks it: leaves that site's channel only
    NEUTRAL = "neutral"  # says nothing about the proxy (a 404, a 5xx of the site)


def next_score(score: float, event: Event, smooth_above: float = 10.0) -> float | None:
    """haipproxy's rule; None means "remove the proxy". Non-scoring events leave it unchanged."""
    if event is Event.SUCCESS:
        return score + (1.0 if score < smooth_above else round(10.0 / score, 2))
    if event is Event.TIMEOUT:
        score -= 1.0
        return None if score <= 0 else score
    if event is Event.DEAD:
        return None
    return score


_BAN_STATUSES = {401, 403, 429}


def classify(status: int | None, error: BaseException | None) -> Event:
    """Map a request outcome (our error tree, or raw requests/aiohttp/OS errors) to an Event."""
    if error is None:
        if status is None:
            return Event.NEUTRAL
        if status < 400:
            return Event.SUCCESS
        if status == 407:  # the proxy rejected our credentials
            return Event.DEAD
        return Event.BANNED if status in _BAN_STATUSES else Event.NEUTRAL
    if isinstance(error, cc.FetchTimeout):
        return Event.TIMEOUT
    if isinstance(error, cc.ProxyError | cc.ConnectError):
        return Event.DEAD
    if isinstance(error, cc.BannedError | cc.Forbidden | cc.RateLimited):
        return Event.BANNED
    if isinstance(error, cc.HTTPStatusError):
        return classify(error.status, None)
    if isinstance(error, cc.ChainCrawlError):
        return Event.NEUTRAL
    return _classify_foreign(error)


def _classify_foreign(error: BaseException) -> Event:
    """Errors straight from an HTTP client, for callers that skip our fetch layer."""
    try:
        import requests
    except ImportError:  # pragma: no cover - requests is a dependency
        requests = None  # type: ignore[assignment]
    if requests is not None:
        exc = requests.exceptions
        if isinstance(error, exc.ConnectTimeout):
            # requests reports a proxy that never accepts as ConnectTimeout; treat as slow
            return Event.TIMEOUT
        if isinstance(error, exc.ProxyError | exc.ConnectionError) and not isinstance(
            error, exc.ReadTimeout
        ):
            return Event.DEAD
        if isinstance(error, exc.Timeout):
            return Event.TIMEOUT
    if isinstance(error, TimeoutError | socket.timeout):
        return Event.TIMEOUT
    if isinstance(error, ConnectionError):
        return Event.DEAD
    return Event.NEUTRAL
