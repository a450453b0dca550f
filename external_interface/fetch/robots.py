"""robots.txt, honoured per site: fetched once per origin for every worker, parsed by Protego.

    policy = RobotsPolicy(redis, fetch, settings)
    policy.check(url, site="demo")      # raises RobotsDisallowed (skip) / RobotsUnavailable (wait)
    policy.allowed(url) -> bool
    policy.crawl_delay(url) -> float | None

Protego is the parser Scrapy uses (Google's matching rules: longest match wins, `*` and `$`
wildcards, the user agent's product token picks the group). The first worker to need an
origin's robots.txt fetches it (a Redis lock keeps the others from doing the same), stores
the outcome in Redis with a TTL, and every worker keeps the parsed rules in memory until that
TTL ends: a request costs one in-memory match, no Redis call.

What a fetch outcome means (RFC 9309, as Google applies it):

| robots.txt answer                      | rules                              | kept for              |
| -------------------------------------- | ---------------------------------- | --------------------- |
| 2xx (after redirects)                  | its rules (first 512 KiB)          | ROBOTS_TTL            |
| 4xx except 429 (none, or forbidden)    | everything allowed                 | ROBOTS_TTL            |
| too many redirects                     | everything allowed                 | ROBOTS_TTL            |
| 429, 5xx                               | nothing allowed: requests *wait*   | ROBOTS_ERROR_TTL      |
| no answer (refused, reset, timeout)    | nothing allowed: requests *wait*   | ROBOTS_UNREACHABLE_TTL|
| larger than the fetch's size limit     | everything allowed (logged)        | ROBOTS_TTL            |

No answer at all is most often a site that is down for a moment (restarting, not up yet): it is
fetched again after ROBOTS_UNREACHABLE_TTL (seconds), the wait doubling with each failure in a
row up to ROBOTS_ERROR_TTL, so a site that comes back is crawled within seconds and one that
stays down costs one connection attempt per origin per wait, for every worker.

A disallowed URL raises `RobotsDisallowed` (policy `skip`: counted, never retried). An
unreadable robots.txt raises `RobotsUnavailable` (policy `wait`): the page comes back when the
outcome expires rather than being dropped for good over a passing failure; pages waiting longer
than `RESOURCE_WAIT_MAX` end as failures, as for any resource that never comes.
robots.txt itself and non-HTTP URLs are always allowed. A site opts out with
`CHAINCRAWL_ROBOTS_IGNORE=site,...`; `CHAINCRAWL_ROBOTS=off` turns the check off everywhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson
from protego import Protego

from config import Settings, get_settings
from exceptions import (
    FetchError,
    HTTPStatusError,
    ResponseTooLarge,
    RobotsDisallowed,
    RobotsUnavailable,
    TooManyRedirects,
)
from external_interface.fetch import Fetcher, FetchRequest
from external_interface.fetch.response import default_user_agent, has_user_agent
from utils.redis import get_redis

log = logging.getLogger(__name__)

MAX_PARSED_BYTES = 512 * 1024  # RFC 9309: parse at least the first 500 KiB
FETCH_MAX_BYTES = 2 * 1024 * 1024
LOCK_WAIT = 20.0  # seconds a worker waits for another worker's fetch before fetching itself
LOCAL_ORIGINS = 4096  # parsed robots.txt kept in memory per process
NO_ANSWER = ", no answer"  # the end of the detail of a fetch that got no HTTP answer

# fetch(url) -> an object with `.status` and `.content` (a fetch.Response), or a FetchError
FetchFn = Callable[[str], Any]
State = Literal["rules", "allow_all", "unreachable"]
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class RobotsRules:
    """One origin's robots.txt outcome, as every worker sees it until `expires` (epoch s)."""

    origin: str
    state: State
    detail: str
    expires: float
    parser: Protego | None = None

    def allows(self, url: str, user_agent: str) -> bool:
        if self.state == "rules" and self.parser is not None:
            return bool(self.parser.can_fetch(url, user_agent))
        return self.state == "allow_all"


def origin_of(url: str) -> str | None:
    """`scheme://host[:port]` of an http(s) URL (lower case, default port dropped), else None."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        return None
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        host = f"{host}:{port}"
    return f"{scheme}://{host}"


def fetch_with(
    fetcher: Fetcher, settings: Settings | None = None, headers: dict[str, str] | None = None
) -> FetchFn:
    """A `FetchFn` that GETs robots.txt through `fetcher` (redirects followed, size capped)."""
    s = settings or get_settings()

    sent = dict(headers or {})
    if not has_user_agent(sent):  # as the pages are asked for, under the token it matches
        sent["User-Agent"] = default_user_agent()

    def fetch(url: str) -> Any:
        return fetcher.fetch(
            FetchRequest(
                method="GET",
                url=url,
                headers=sent,
                timeout=s.request_timeout,
                connect_timeout=s.connect_timeout,
                max_bytes=FETCH_MAX_BYTES,
            )
        )

    return fetch


def settings_policy(fetcher: Fetcher, settings: Settings) -> RobotsPolicy:
    """The policy of a worker's runtime: robots.txt through `fetcher`, cached in its Redis."""
    return RobotsPolicy(get_redis(settings.redis_url), fetch_with(fetcher, settings), settings)


class RobotsPolicy:
    """Decides whether a URL may be fetched, from its origin's robots.txt (module docstring)."""

    def __init__(
        self,
        client: Any,
        fetch: FetchFn,
        settings: Settings | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = s = settings or get_settings()
        self.r = client or get_redis(s.redis_url)
        self.fetch = fetch
        self.enabled = s.robots
        self.ignore = frozenset(x.strip() for x in s.robots_ignore.split(",") if x.strip())
        self.user_agent = s.robots_user_agent
        self.ttl = s.robots_ttl
        self.error_ttl = s.robots_error_ttl
        self.unreachable_ttl = min(s.robots_unreachable_ttl, s.robots_error_ttl)
        self.clock = clock
        self._local: OrderedDict[str, RobotsRules] = OrderedDict()
        self._locks: dict[str, Any] = {}

    def applies(self, site: str | None) -> bool:
        """Whether robots.txt is checked for `site` (on, and the site has not opted out)."""
        return self.enabled and (site is None or site not in self.ignore)

    def key(self, origin: str) -> str:
        return self.settings.key("robots", origin)

    # -- the checks

    def check(self, url: str, user_agent: str | None = None, site: str | None = None) -> None:
        """Return when `url` may be fetched; raise `RobotsDisallowed` (skip it) or
        `RobotsUnavailable` (robots.txt unreadable: wait, `retry_after` set)."""
        if not self.applies(site):
            return
        rules = self.rules(url)
        if rules is None or _is_robots_url(url):
            return
        agent = user_agent or self.user_agent
        if rules.state == "unreachable":
            left = max(1.0, rules.expires - self.clock())
            raise RobotsUnavailable(
                f"robots.txt of {rules.origin} unreadable ({rules.detail}); requests to it "
                f"wait, next try in {left:.0f}s",
                retry_after=left,
            )
        if not rules.allows(url, agent):
            raise RobotsDisallowed(
                f"robots.txt of {rules.origin} disallows {url} for {agent!r}",
                url=url,
                user_agent=agent,
            )

    def allowed(self, url: str, user_agent: str | None = None, site: str | None = None) -> bool:
        """`check` as a bool: False when disallowed or while robots.txt is unreadable."""
        try:
            self.check(url, user_agent, site)
        except (RobotsDisallowed, RobotsUnavailable):
            return False
        return True

    def crawl_delay(self, url: str, user_agent: str | None = None) -> float | None:
        """Seconds between requests the site asks of this agent (`Crawl-delay`, else
        `Request-rate`), or None."""
        rules = self.rules(url)
        if rules is None or rules.parser is None:
            return None
        agent = user_agent or self.user_agent
        delay = rules.parser.crawl_delay(agent)
        if delay is not None:
            return float(delay)
        rate = rules.parser.request_rate(agent)
        if rate is not None and rate.requests:
            return float(rate.seconds) / float(rate.requests)
        return None

    def sitemaps(self, url: str) -> list[str]:
        """The `Sitemap:` URLs of the origin's robots.txt."""
        rules = self.rules(url)
        return list(rules.parser.sitemaps) if rules is not None and rules.parser else []

    # -- the rules: memory, then Redis, then one fetch for every worker

    def rules(self, url: str) -> RobotsRules | None:
        """The origin's current rules (None for a non-HTTP URL)."""
        origin = origin_of(url)
        if origin is None:
            return None
        now = self.clock()
        rules = self._local.get(origin)
        if rules is not None and rules.expires > now:
            return rules
        lock = self._locks.setdefault(origin, threading.Lock())
        with lock:  # one lookup per origin and process at a time
            rules = self._local.get(origin)
            if rules is None or rules.expires <= self.clock():
                rules = self._shared(origin)
                self._remember(rules)
        return rules

    def forget(self, url: str) -> None:
        """Drop the origin's robots.txt here and in Redis: the next check fetches it again."""
        origin = origin_of(url)
        if origin is not None:
            self._local.pop(origin, None)
            self.r.delete(self.key(origin))

    def _remember(self, rules: RobotsRules) -> None:
        self._local[rules.origin] = rules
        self._local.move_to_end(rules.origin)
        while len(self._local) > LOCAL_ORIGINS:
            self._local.popitem(last=False)

    def _shared(self, origin: str) -> RobotsRules:
        key = self.key(origin)
        raw = self.r.get(key)
        stored = self._load(origin, raw)
        if stored is not None:
            return stored
        lock_key = f"{key}:lock"
        deadline = time.monotonic() + LOCK_WAIT
        while not self.r.set(lock_key, "1", nx=True, px=round(LOCK_WAIT * 1000)):
            if time.monotonic() > deadline:
                break  # the fetching worker died or hangs: fetch it here
            time.sleep(0.05)
            raw = self.r.get(key)
            stored = self._load(origin, raw)
            if stored is not None:
                return stored
        try:
            state, detail, body = self._fetch(origin)
            fetched = self.clock()
            doc: dict[str, Any] = {"state": state, "detail": detail, "body": body}
            keep = ttl = self.error_ttl if state == "unreachable" else self.ttl
            if state == "unreachable" and detail.endswith(NO_ANSWER):
                # a site down for a moment: fetched again soon, then less and less often; the
                # document outlives its expiry so that the next fetch counts the failures
                failures = _previous_failures(raw) + 1
                ttl = min(self.error_ttl, self.unreachable_ttl * 2 ** (failures - 1))
                keep = ttl + self.error_ttl
                doc["failures"] = failures
                if failures > 1:
                    doc["detail"] = f"{detail}, {failures} times in a row"
            doc.update(fetched=fetched, expires=fetched + ttl)
            self.r.set(key, orjson.dumps(doc), px=max(1, round(keep * 1000)))
        finally:
            self.r.delete(lock_key)
        log.info("robots.txt of %s: %s (%s)", origin, state, doc["detail"])
        return _rules(origin, doc)

    def _load(self, origin: str, raw: bytes | str | None) -> RobotsRules | None:
        if raw is None:
            return None
        doc = orjson.loads(raw)
        if doc["expires"] <= self.clock():
            return None
        return _rules(origin, doc)

    def _fetch(self, origin: str) -> tuple[State, str, str]:
        """(state, detail, body) of one fetch of the origin's robots.txt."""
        url = f"{origin}/robots.txt"
        try:
            resp = self.fetch(url)
        except HTTPStatusError as exc:  # a fetch function that raises for >= 400 (Context.get)
            return _by_status(exc.status, "")
        except ResponseTooLarge:
            log.warning("robots.txt of %s is over the fetch's size limit: not obeyed", origin)
            return "allow_all", "too large", ""
        except TooManyRedirects:  # RFC 9309 2.3.1.2: no robots.txt after the redirects
            return "allow_all", "too many redirects", ""
        except FetchError as exc:  # refused, reset, timed out, cut short: no answer
            return "unreachable", f"{type(exc).__name__}{NO_ANSWER}", ""
        body = bytes(resp.content[:MAX_PARSED_BYTES]).decode("utf-8", errors="replace")
        return _by_status(int(resp.status), body)


def _previous_failures(raw: bytes | str | None) -> int:
    """How many fetches in a row got no answer before this one (0 after any answer)."""
    if raw is None:
        return 0
    try:
        return int(orjson.loads(raw).get("failures", 0))
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        return 0


def _by_status(status: int, body: str) -> tuple[State, str, str]:
    detail = f"HTTP {status}"
    if 200 <= status < 300:
        return "rules", detail, body
    if status == 429 or status >= 500:
        return "unreachable", detail, ""
    return "allow_all", detail, ""  # 4xx, or a redirect the fetcher did not follow


def _rules(origin: str, doc: dict[str, Any]) -> RobotsRules:
    state: State = doc["state"]
    parser = Protego.parse(doc["body"]) if state == "rules" else None
    return RobotsRules(origin, state, doc["detail"], float(doc["expires"]), parser)


def _is_robots_url(url: str) -> bool:
    return urlsplit(url).path == "/robots.txt"
