"""What a render asks for and what it gives back, and how both cross to the browser driver.

A `RenderRequest` names a URL, what to wait for, the page actions to run (click, scroll to
the end, "load more" until it is gone), the deadline and what the pools lent (proxy, cookies,
user agent). The driver answers with the rendered DOM as a `fetch.Response`, so endpoints
parse a rendered page with the same `css`/`xpath`/`json` helpers as a fetched one, plus the
page's own answers whose URLs match `capture_json` (often the cleanest way to read a JS site).

Requests and replies cross a private Unix socket as JSON headers with binary parts
(`wire.py`); the `to_wire`/`from_wire` functions here are the only code that knows their
shape. Cookies and proxy credentials cross that socket only: they are kept out of `repr`
and never logged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal
from urllib.parse import unquote, urlsplit

from external_interface.browser.selector_check import check_syntax
from external_interface.fetch import Response

WaitUntil = Literal["load", "domcontentloaded", "networkidle", "commit"]
WAIT_UNTIL: tuple[str, ...] = ("load", "domcontentloaded", "networkidle", "commit")
# Playwright's resource types; images, fonts and media are blocked by default (CPU, bandwidth)
RESOURCE_TYPES = frozenset(
    (
        "document",
        "stylesheet",
        "image",
        "media",
        "font",
        "script",
        "texttrack",
        "xhr",
        "fetch",
        "eventsource",
        "websocket",
        "manifest",
        "other",
    )
)
DEFAULT_BLOCK: tuple[str, ...] = ("image", "font", "media")


# --- actions --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Action:
    """One step run on the page after it loaded, in order. Subclasses name their `kind`."""

    kind: ClassVar[str] = ""

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, **{k: v for k, v in self.__dict__.items()}}


@dataclass(frozen=True)
class WaitFor(Action):
    """Wait until `selector` matches (`state`: visible, attached, hidden or detached)."""

    selector: str
    state: Literal["visible", "attached", "hidden", "detached"] = "visible"
    kind: ClassVar[str] = "wait_for"


@dataclass(frozen=True)
class Click(Action):
    """Click the first element matching `selector`; then wait for `wait_for` if given."""

    selector: str
    wait_for: str | None = None
    kind: ClassVar[str] = "click"


@dataclass(frozen=True)
class Wait(Action):
    """Sleep `ms` milliseconds (still bounded by the render's deadline)."""

    ms: int
    kind: ClassVar[str] = "wait"


@dataclass(frozen=True)
class ScrollToEnd(Action):
    """Infinite scroll: scroll to the bottom until no new content arrives.

    New content is more elements matching `item` (or, without it, more elements in the page).
    After each scroll the round waits for new content; without `until`, the list is complete
    once the page has been quiet for `quiet_ms`: no new content, no request in flight and
    none started (a slow answer is waited for, however long it takes within `settle_ms`). A
    round still loading after `settle_ms` without new content fails the render (a timeout, to
    retry) rather than call a partial list complete. With `until`, a selector that appears once
    everything is loaded, a round that adds nothing before it appears fails the render too.
    `max_rounds` bounds it. `item` and `until` are plain CSS (counted in the page)."""

    item: str | None = None
    until: str | None = None
    max_rounds: int = 100
    settle_ms: int = 15000
    quiet_ms: int = 1000
    kind: ClassVar[str] = "scroll_to_end"


@dataclass(frozen=True)
class LoadMore(Action):
    """Click a "load more" `selector` until it is gone, hidden or disabled (`max_clicks` at most).

    Each click must add content (more `item` elements, or more elements in the page) within
    `settle_ms`; a click that adds nothing fails the render (a timeout to retry) rather than
    return a partial list."""

    selector: str
    item: str | None = None
    max_clicks: int = 100
    settle_ms: int = 5000
    kind: ClassVar[str] = "load_more"


ACTIONS: dict[str, type[Action]] = {
    a.kind: a for a in (WaitFor, Click, Wait, ScrollToEnd, LoadMore)
}


def action_from_wire(data: Mapping[str, Any]) -> Action:
    kind = data.get("kind", "")
    cls = ACTIONS.get(str(kind))
    if cls is None:
        raise ValueError(f"unknown action kind {kind!r}; known: {', '.join(sorted(ACTIONS))}")
    return cls(**{k: v for k, v in data.items() if k != "kind"})


def _check_action(a: Action) -> None:
    if not isinstance(a, Action) or not a.kind:
        raise TypeError(f"actions must be Click, WaitFor, Wait, ScrollToEnd or LoadMore, got {a!r}")
    for name in ("selector", "item", "until", "wait_for"):
        value = getattr(a, name, None)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{a.kind}: {name} must be a non-empty CSS selector, got {value!r}")
        if value is not None:
            check_syntax(value, f"{a.kind}.{name}")
    for name in ("max_rounds", "max_clicks", "settle_ms", "quiet_ms", "ms"):
        value = getattr(a, name, None)
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ValueError(f"{a.kind}: {name} must be a non-negative integer, got {value!r}")


# --- request --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RenderRequest:
    """One page to render. `timeout` is the whole render's deadline in seconds, waiting for a
    free browser context included (None: the pool's default, `CHAINCRAWL_BROWSER_TIMEOUT`).
    `block` lists resource types aborted before they load (None: the pool's default, images,
    fonts and media); `()` blocks nothing and keeps the browser's HTTP cache.

    A document answering an error status (>= 400) is returned as loaded, at once, without
    waiting for `wait_for` or running the actions: its error page would never show them."""

    url: str
    wait_for: str | None = None
    actions: Sequence[Action] = ()
    timeout: float | None = None
    proxy: str | None = field(default=None, repr=False)
    cookies: Mapping[str, str] = field(default_factory=dict, repr=False)
    user_agent: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    capture_json: str | None = None
    wait_until: WaitUntil = "load"
    block: Sequence[str] | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"render url must be an absolute http(s) URL, got {self.url!r}")
        if self.wait_until not in WAIT_UNTIL:
            raise ValueError(
                f"wait_until must be one of {', '.join(WAIT_UNTIL)}, got {self.wait_until!r}"
            )
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"render timeout must be > 0 seconds, got {self.timeout!r}")
        if self.wait_for is not None and not self.wait_for.strip():
            raise ValueError("wait_for must be a non-empty CSS selector or None")
        if self.wait_for is not None:
            check_syntax(self.wait_for, "wait_for")
        object.__setattr__(self, "actions", tuple(self.actions))
        for a in self.actions:
            _check_action(a)
        if self.capture_json is not None:
            try:
                re.compile(self.capture_json)
            except re.error as exc:
                raise ValueError(f"capture_json is not a valid regular expression: {exc}") from None
        if self.block is not None:
            unknown = set(self.block) - RESOURCE_TYPES
            if unknown:
                raise ValueError(
                    f"block: unknown resource types {sorted(unknown)}; known: {sorted(RESOURCE_TYPES)}"
                )
            object.__setattr__(self, "block", tuple(self.block))
        if self.proxy is not None:
            proxy_parts(self.proxy)  # raises on a malformed proxy URL

    def to_wire(self, default_timeout: float, default_block: Sequence[str]) -> dict[str, Any]:
        """The request as the driver reads it, the pool's defaults filled in."""
        return {
            "op": "render",
            "url": self.url,
            "wait_for": self.wait_for,
            "actions": [a.to_wire() for a in self.actions],
            "timeout": self.timeout if self.timeout is not None else default_timeout,
            "proxy": proxy_parts(self.proxy) if self.proxy else None,
            "cookies": dict(self.cookies),
            "user_agent": self.user_agent,
            "headers": dict(self.headers),
            "capture_json": self.capture_json,
            "wait_until": self.wait_until,
            "block": list(self.block if self.block is not None else default_block),
        }


def proxy_parts(proxy: str) -> dict[str, str]:
    """A proxy URL as Playwright takes it: `server` without credentials, and the credentials
    apart (Chromium ignores them inside the URL)."""
    url = proxy if "://" in proxy else f"http://{proxy}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "socks5", "socks4") or not parts.hostname:
        raise ValueError("proxy must be scheme://host:port (http, https, socks4 or socks5)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("proxy port is not a number") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    out = {"server": f"{parts.scheme}://{host}" + (f":{port}" if port else "")}
    if parts.username is not None:
        out["username"] = unquote(parts.username)
        out["password"] = unquote(parts.password or "")
    return out


# --- result ---------------------------------------------------------------------------------
@dataclass
class RenderResult:
    """A rendered page: its DOM as a `Response` (status, headers and `elapsed` of the main
    document, `content` the serialized DOM in UTF-8), the answers captured by `capture_json` in
    arrival order (each a `Response` with its own `json()`), what each action did, and the
    whole render's time (`elapsed`)."""

    response: Response
    captured: tuple[Response, ...] = ()
    steps: tuple[Mapping[str, Any], ...] = ()
    elapsed: float = 0.0

    def json_answers(self) -> list[Any]:
        """Every captured answer's JSON (raises ParseError for one that is not JSON)."""
        return [r.json() for r in self.captured]

    def page(self) -> RenderedPage:
        """The result as one `Response` of the rendered DOM that also carries the captures."""
        r = self.response
        return RenderedPage(
            url=r.url,
            status=r.status,
            headers=r.headers,
            content=r.content,
            elapsed=r.elapsed,
            declared_encoding=r.declared_encoding,
            history=r.history,
            captured=self.captured,
            steps=self.steps,
        )


@dataclass
class RenderedPage(Response):
    """A rendered page, as an endpoint gets it from `ctx.render`: a `Response` of the DOM
    (`css`, `xpath`, `text`; `status` and `headers` of the main document), plus the page's own
    answers whose URLs matched `capture_json` (`captured`, `json_answers()`) and what each
    action did (`steps`)."""

    captured: tuple[Response, ...] = ()
    steps: tuple[Mapping[str, Any], ...] = ()

    def json_answers(self) -> list[Any]:
        """Every captured answer's JSON, in arrival order (ParseError for one that is not)."""
        return [r.json() for r in self.captured]


def result_from_wire(header: Mapping[str, Any], blobs: Sequence[bytes]) -> RenderResult:
    page = header["page"]
    response = Response(
        url=page["url"],
        status=int(page["status"]),
        headers=dict(page.get("headers") or {}),
        content=blobs[page["blob"]],
        # the document's own time when the browser measured it (as a fetch's), else the render's
        elapsed=float(page.get("elapsed") or header.get("elapsed", 0.0)),
        declared_encoding="utf-8",  # the DOM is serialized by us, in UTF-8, whatever the page's
        history=list(page.get("history") or []),
    )
    captured = tuple(
        Response(
            url=c["url"],
            status=int(c["status"]),
            headers=dict(c.get("headers") or {}),
            content=blobs[c["blob"]],
            elapsed=0.0,
            declared_encoding=None,  # JSON is UTF-8; other text by its meta charset
        )
        for c in header.get("captured", ())
    )
    return RenderResult(
        response=response,
        captured=captured,
        steps=tuple(header.get("steps", ())),
        elapsed=float(header.get("elapsed", 0.0)),
    )
