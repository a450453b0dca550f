"""chaincrawl's error tree. Every error an endpoint can meet maps to one retry policy.

    ChainCrawlError
    ├── ConfigError ............................ fail   (bad settings; a user mistake)
    ├── ChainDefinitionError ................... fail   (raised when a chain is defined)
    │   ├── UnknownTaskError
    │   ├── MissingMappingError
    │   ├── UnknownFieldError
    │   └── ChainCycleError
    ├── ParamsError ............................ fail   (parameters fail the endpoint schema)
    ├── UnknownChainError ...................... fail
    └── CrawlError  (raised while a task runs)
        ├── FetchError
        │   ├── TransportError ................. retry
        │   │   ├── FetchTimeout ............... retry
        │   │   ├── ConnectError ............... rotate (the proxy/route is likely bad)
        │   │   └── ProxyError ................. rotate
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
        ├── ResourceUnavailable ................ wait   (pool empty: re-queue, not a failure)
        │   └── Throttled ...................... wait   (a shared rate limit / concurrency cap)
        ├── DeadlineExceeded ................... retry  (the per-task deadline ran out)
        ├── ParseError ......................... retry  (then dead-letter: layout changed?)
        ├── ItemValidationError ................ fail   (parsed data fails the Item schema)
        └── PoisonMessage ...................... fail   (delivered too often; worker keeps dying)

Policies: `retry` = back off and try again; `rotate` = return the lent resources as bad,
then retry with fresh ones; `fail` = no retry, straight to the dead-letter store;
`wait` = re-queue after a short countdown without spending a retry. Unknown exceptions
(bugs in endpoint code) are treated as `retry` so a transient bug can recover, and end in
the dead-letter store with their traceback.
"""

from __future__ import annotations

import enum


class Policy(enum.StrEnum):
    RETRY = "retry"
    ROTATE = "rotate"
    FAIL = "fail"
    WAIT = "wait"


class ChainCrawlError(Exception):
    """Base of every chaincrawl error."""

    policy: Policy = Policy.FAIL


class ConfigError(ChainCrawlError):
    """A setting is missing or invalid."""


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


class HTTPStatusError(FetchError):
    """The server answered with an error status."""

    def __init__(self, message: str, status: int, url: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.url = url


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


class DeadlineExceeded(CrawlError):
    """The per-task deadline ran out (holds on threads/gevent where Celery limits do not)."""

    policy = Policy.RETRY


class ParseError(CrawlError):
    """The page did not look as the parser expects."""

    policy = Policy.RETRY


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
