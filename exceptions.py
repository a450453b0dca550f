"""chaincrawl's error tree. Every error an endpoint can meet maps to one retry policy.

    ChainCrawlError
    ├── ConfigError ............................ fail   (bad settings; a user mistake)
    │   └── SecretUnreadable ................... fail   (a secret in Redis sealed with another key)
    ├── ChainDefinitionError ................... fail   (raised when a chain is defined)
    │   ├── UnknownTaskError
    │   ├── MissingMappingError
    │   ├── UnknownFieldError
    │   └── ChainCycleError
    ├── ParamsError ............................ fail   (parameters fail the endpoint schema)
    ├── UnknownChainError ...................... fail
    ├── WorkersOutdated ........................ fail   (live workers lack a chain's tasks: restart them)
    ├── QueuesUnserved ......................... fail   (no live worker consumes a chain's queue: restart them)
    └── CrawlError  (raised while a task runs)
        ├── FetchError
        │   ├── TransportError ................. retry
        │   │   ├── FetchTimeout ............... retry
        │   │   │   └── RenderTimeout .......... retry  (a page that never settled; + capture)
        │   │   │       └── SelectorTimeout .... fail   (the page loaded and went quiet, the selector never came)
        │   │   ├── ConnectError ............... rotate (the proxy/route is likely bad)
        │   │   ├── ProxyError ................. rotate
        │   │   └── BrowserCrashed ............. retry  (on a new browser)
        │   ├── RenderError .................... retry  (the browser refused a page or action; + capture)
        │   │   └── InvalidSelector ............ fail   (a selector that cannot be parsed; no page is loaded)
        │   ├── BrowserUnavailable ............. fail   (no Chromium or Playwright installed)
        │   ├── HTTPStatusError
        │   │   ├── NotFound (404, 410) ........ fail
        │   │   ├── ClientError (other 4xx) .... fail
        │   │   ├── RateLimited (429) .......... rotate
        │   │   ├── Forbidden (401, 403) ....... rotate
        │   │   └── ServerError (5xx) .......... retry
        │   ├── ResponseTooLarge ............... fail
        │   ├── TooManyRedirects ............... fail
        │   └── TruncatedResponse .............. retry
        ├── BannedError ........................ rotate (ban page, login wall, captcha)
        │   ├── LoginRequired
        │   └── CaptchaRequired
        ├── Skipped ............................ skip   (not fetched on purpose; counted by reason)
        │   ├── RobotsDisallowed ............... skip   (the site's robots.txt forbids the URL)
        │   └── HookSkip ....................... skip   (a lifecycle hook said skip, with its reason)
        ├── HookRetry .......................... retry  (a lifecycle hook said retry)
        ├── HookFailed ......................... fail   (a lifecycle hook said fail, with its reason)
        ├── ResourceUnavailable ................ wait   (pool empty: re-queue, not a failure)
        │   ├── Throttled ...................... wait   (a shared rate limit / concurrency cap)
        │   └── RobotsUnavailable .............. wait   (robots.txt unreachable or 5xx: not yet)
        ├── DeadlineExceeded ................... retry  (the per-task deadline ran out)
        ├── ParseError ......................... retry  (then dead-letter: layout changed?)
        │   ├── EmptyPage ...................... retry  (a `must_yield` endpoint's page yielded
        │   │                                             nothing: a soft block or a page cut
        │   │                                             short may come back whole)
        │   └── MalformedBody .................. fail   (a 2xx body that is not valid JSON: the
        │                                                 same bytes come back on a refetch)
        ├── UndecodableText .................... fail   (bytes not in the page's charset, with
        │                                                 `decode_errors="strict"`)
        ├── ItemValidationError ................ fail   (parsed data fails the Item schema)
        └── PoisonMessage ...................... fail   (delivered too often; worker keeps dying)

What each policy does, and what its settings are: docs/architecture.md, "Errors and retry
policies". Unknown exceptions (bugs in endpoint code) retry, so a transient bug can recover.
"""

from __future__ import annotations

import enum
import re
from urllib.parse import urlsplit, urlunsplit


class Policy(enum.StrEnum):
    RETRY = "retry"
    ROTATE = "rotate"
    FAIL = "fail"
    WAIT = "wait"
    SKIP = "skip"


class ChainCrawlError(Exception):
    """Base of every chaincrawl error."""

    policy: Policy = Policy.FAIL


class ConfigError(ChainCrawlError):
    """A setting is missing or invalid."""


class SecretUnreadable(ConfigError):
    """A secret kept in Redis does not open with this process's keys: it was sealed with
    another key (processes sharing a Redis need the same CHAINCRAWL_SECRET_KEY), or stored in
    clear (utils/seal.py)."""


class ChainDefinitionError(ChainCrawlError):
    """A chain cannot be built as written."""


class UnknownTaskError(ChainDefinitionError):
    """A step names a task no endpoint module defines."""


class MissingMappingError(ChainDefinitionError):
    """A required parameter of a step has no mapping from its parent's output."""


class UnknownFieldError(ChainDefinitionError):
    """A mapping reads a field the parent's items do not have."""


class ChainCycleError(ChainDefinitionError):
    """Steps refer to each other in a loop."""


class UnknownChainError(ChainCrawlError):
    """No chain is registered under that name."""


class WorkersOutdated(ChainCrawlError):
    """Live workers do not know tasks a chain needs (an endpoint added, or a route changed,
    after they started): sending would have them drop the messages. Raised before anything
    is sent; names the tasks (`tasks`) and the workers (`workers`)."""

    def __init__(
        self, msg: str, tasks: list[str] | None = None, workers: list[str] | None = None
    ) -> None:
        super().__init__(msg)
        self.tasks = list(tasks or ())
        self.workers = list(workers or ())


class QueuesUnserved(ChainCrawlError):
    """Workers are up but none consumes a queue the chain needs (a site added after they
    started): its tasks would wait for good. Raised before anything is sent when the caller
    does not want to wait (`chains.run(..., wait_for_workers=False)`); `queues` names them."""

    def __init__(self, msg: str, queues: list[str] | None = None) -> None:
        super().__init__(msg)
        self.queues = list(queues or ())


class ParamsError(ChainCrawlError):
    """Parameters do not fit an endpoint's Params schema (names the field)."""


class CrawlError(ChainCrawlError):
    """Anything that goes wrong while a task runs."""

    policy = Policy.RETRY


class FetchError(CrawlError):
    """Fetching a URL failed."""


class TransportError(FetchError):
    """The request never got a complete response."""

    policy = Policy.RETRY


class FetchTimeout(TransportError):
    """The request (or the task's remaining deadline) timed out."""

    policy = Policy.RETRY


class ConnectError(TransportError):
    """The connection was refused or reset."""

    policy = Policy.ROTATE


class ProxyError(TransportError):
    """The proxy failed (refused, bad gateway from the proxy itself)."""

    policy = Policy.ROTATE


class PageCapture:
    """Mixin of the errors of a rendered page: what the page showed when it failed.

    `screenshot` is PNG bytes, `dom` the serialized DOM, `page_url` the page's URL at the time;
    each is None/"" when the browser could not take it (it crashed, or the page was blank)."""

    screenshot: bytes | None = None
    dom: str | None = None
    page_url: str = ""

    def attach(
        self, page_url: str = "", screenshot: bytes | None = None, dom: str | None = None
    ) -> None:
        self.page_url, self.screenshot, self.dom = page_url, screenshot, dom


class RenderTimeout(FetchTimeout, PageCapture):
    """A page did not load, show the awaited selector or finish its actions within its deadline."""


class SelectorTimeout(RenderTimeout):
    """A loaded page never showed what the render waited for (`wait_for`, a `WaitFor` or a
    `Click` target) although its network had been quiet for a while, with no request failed:
    a retry would wait for the same nothing. Still a `RenderTimeout` (with the capture); a wait
    that ran out with requests in flight or failed stays a plain, retried `RenderTimeout`."""

    policy = Policy.FAIL


class BrowserCrashed(TransportError, PageCapture):
    """The browser (or its driver) died under a page; the next render gets a new browser."""

    policy = Policy.RETRY


class RenderError(FetchError, PageCapture):
    """The browser refused a page or an action failed for a reason other than time (a selector
    Playwright cannot parse, a page that threw); retried, then dead-lettered with its capture."""

    policy = Policy.RETRY


class InvalidSelector(RenderError, ValueError):
    """A selector neither CSS nor Playwright can parse (`div[`, `##id`): the endpoint's bug,
    found before the page is loaded; a `ValueError` too, as every bad render argument is."""

    policy = Policy.FAIL


class BrowserUnavailable(FetchError):
    """No browser can be started here (Chromium or Playwright missing): retrying cannot help."""

    policy = Policy.FAIL


class HTTPStatusError(FetchError):
    """The server answered with an error status. The message names the URL (`HTTP 404 for
    https://host/path`) without its credentials or secret-looking query values: it goes to
    logs, dead letters and the CLI."""

    def __init__(self, message: str, status: int, url: str = "") -> None:
        shown = safe_url(url)
        if shown and shown not in message:
            message = f"{message} for {shown}"
        super().__init__(message)
        self.status = status
        self.url = url


_SECRET_PARAM = re.compile(
    r"(?i)(pass|pwd|secret|token|key|sign|sig$|auth|session|sid$|cookie|credential|ticket)"
)


def safe_url(url: str) -> str:
    """`url` fit for a message: no user:password@, secret-looking query values masked."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)[-1]
        query = "&".join(
            f"{k}=***" if _SECRET_PARAM.search(k) else (f"{k}={v}" if v or "=" in pair else k)
            for pair in parts.query.split("&")
            if pair
            for k, _, v in [pair.partition("=")]
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        return "<url>"


class NotFound(HTTPStatusError):
    policy = Policy.FAIL


class ClientError(HTTPStatusError):
    policy = Policy.FAIL


class RateLimited(HTTPStatusError):
    policy = Policy.ROTATE


class Forbidden(HTTPStatusError):
    policy = Policy.ROTATE


class ServerError(HTTPStatusError):
    policy = Policy.RETRY


class ResponseTooLarge(FetchError):
    policy = Policy.FAIL


class TooManyRedirects(FetchError):
    policy = Policy.FAIL


class TruncatedResponse(FetchError):
    """The body ended before its declared length."""

    policy = Policy.RETRY


class BannedError(CrawlError):
    """The site recognised us: ban page, login wall or captcha. Rotate what was lent."""

    policy = Policy.ROTATE


class LoginRequired(BannedError):
    pass


class CaptchaRequired(BannedError):
    pass


class ResourceUnavailable(CrawlError):
    """A pool (cookies, devices, proxies) is empty for now; come back shortly."""

    policy = Policy.WAIT

    def __init__(self, message: str, retry_after: float = 2.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Throttled(ResourceUnavailable):
    """A shared rate limit or concurrency cap says not yet; waits are not capped."""


class RobotsUnavailable(ResourceUnavailable):
    """The site's robots.txt could not be read (5xx, 429 or unreachable): no request may go
    until it can, so pages wait instead of being skipped for good
    (external_interface/fetch/robots.py)."""


class Skipped(CrawlError):
    """A request deliberately not sent; `reason` names why, for the skip counters."""

    policy = Policy.SKIP
    reason = "skipped"


class RobotsDisallowed(Skipped):
    """robots.txt forbids this URL to our user agent (external_interface/fetch/robots.py)."""

    reason = "robots"

    def __init__(self, message: str, url: str = "", user_agent: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.user_agent = user_agent


class HookSkip(Skipped):
    """A lifecycle hook (lifecycle/hooks.py) said skip: the page ends skipped, counted under
    the hook's reason."""

    def __init__(self, message: str, reason: str = "hook") -> None:
        super().__init__(message)
        self.reason = reason


class HookRetry(CrawlError):
    """A lifecycle hook said retry: the page is tried again, as the retry policy allows."""

    policy = Policy.RETRY


class HookFailed(CrawlError):
    """A lifecycle hook said fail: the page fails for good, dead-lettered with the reason."""

    policy = Policy.FAIL


class DeadlineExceeded(CrawlError):
    """The per-task deadline ran out (holds on threads/gevent where Celery limits do not)."""

    policy = Policy.RETRY


class ParseError(CrawlError):
    """The page did not look as the parser expects."""

    policy = Policy.RETRY


class EmptyPage(ParseError):
    """A page of an endpoint declared `must_yield=True` yielded nothing: no item, no follow-up.

    Retried like any ParseError: a page that came back wrong (a soft block, a placeholder or
    a body cut short answered with 200) often comes back whole; a selector the site's layout
    no longer matches fails the same way every time and is dead-lettered after the retries,
    its URLs in the message. Endpoints without `must_yield` count such a page as `empty`."""


class MalformedBody(ParseError):
    """A successful (2xx) answer whose body does not parse (`resp.json()` on invalid JSON):
    the server answered and refetching gets the same bytes, so the page is dead-lettered at
    once with the reason. An endpoint that knows its site sends a body cut short now and then
    says so with `resp.json(retry=True)` (a `ParseError`, retried)."""

    policy = Policy.FAIL


class UndecodableText(CrawlError):
    """A response's text is not valid in its charset (invalid UTF-8, a mislabelled charset) and
    its endpoint declared `decode_errors="strict"`: the same bytes come back on a retry."""

    policy = Policy.FAIL


class ItemValidationError(CrawlError):
    """Parsed data does not fit the endpoint's Item schema."""

    policy = Policy.FAIL


class PoisonMessage(CrawlError):
    """A message was delivered too many times without finishing (its worker keeps dying)."""

    policy = Policy.FAIL


_STATUS_ERRORS: dict[int, type[HTTPStatusError]] = {
    401: Forbidden,
    403: Forbidden,
    404: NotFound,
    410: NotFound,
    429: RateLimited,
}


def error_for_status(status: int, url: str = "") -> HTTPStatusError:
    """The typed error for an HTTP error status (only call for status >= 400)."""
    cls = _STATUS_ERRORS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ClientError
    return cls(f"HTTP {status}", status=status, url=url)


def policy_for(exc: BaseException) -> Policy:
    """The retry policy for any exception; unknown ones (endpoint bugs) retry."""
    if isinstance(exc, ChainCrawlError):
        return exc.policy
    return Policy.RETRY
