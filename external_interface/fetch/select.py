"""Which fetcher sends a request: the registry of fetchers by name, the set a worker process
keeps (`FetcherSet`, routing each request by `FetchRequest.fetcher`), what an endpoint or a
site chose (`choose`), and `default_fetcher`, the stack workers fetch through.

    pycurl       CurlFetcher, the default: libcurl through pycurl, the least CPU per request
                 (HTTP/1.1 like the others; a runtime dependency: if it cannot be imported,
                 choosing it, by default or by name, is a ConfigError saying why and how)
    urllib3      Urllib3Fetcher: the same contract on urllib3, pure Python
    requests     RequestsFetcher: the same contract on requests
    impersonate  ImpersonateFetcher: a browser's TLS, HTTP/2 and headers (curl_cffi)

An endpoint declares `fetcher="impersonate"` (or `impersonate:firefox`, `impersonate:safari`);
a deployment sets `CHAINCRAWL_FETCHER_<SITE>` the same way, which wins over the declaration
(the operator has the last word, as for providers); `CHAINCRAWL_FETCHER` is every other
request's. The profile's form (desktop, mobile, app) is the platform's unless spelled out
(`impersonate:chrome/desktop`). The fetch slots and the development HTTP cache are shared by
every fetcher of the process: they wrap the set.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from config import SITE_VARS, Settings, site_env
from exceptions import ConfigError
from external_interface.fetch.base import Fetcher, FetchRequest
from external_interface.fetch.cache import CachingFetcher, HttpCache
from external_interface.fetch.curl import MISSING, CurlFetcher, installed
from external_interface.fetch.http import RequestsFetcher, Urllib3Fetcher
from external_interface.fetch.impersonate import ImpersonateFetcher
from external_interface.fetch.limits import LimitedFetcher
from external_interface.fetch.profiles import Profile
from external_interface.fetch.response import Response
from external_interface.resources.user_agent import family as platform_family
from utils.registry import Registry, UnknownNameError

IMPERSONATE = "impersonate"
PYCURL = "pycurl"
DEFAULT = PYCURL  # CHAINCRAWL_FETCHER's default (config.Settings.fetcher)


@dataclass(frozen=True)
class FetcherOptions:
    """What every fetcher of a process is built with."""

    max_redirects: int = 10
    ca_bundle: str = ""  # PEM file of the CAs to trust ("": certifi's), CHAINCRAWL_CA_BUNDLE


FETCHERS: Registry[Callable[[FetcherOptions], Fetcher]] = Registry("fetcher")
FETCHERS.add("urllib3", lambda o: Urllib3Fetcher(o.max_redirects, ca_bundle=o.ca_bundle))
FETCHERS.add("requests", lambda o: RequestsFetcher(o.max_redirects, ca_bundle=o.ca_bundle))
FETCHERS.add(IMPERSONATE, lambda o: ImpersonateFetcher(o.max_redirects, ca_bundle=o.ca_bundle))
FETCHERS.add(PYCURL, lambda o: CurlFetcher(o.max_redirects, ca_bundle=o.ca_bundle))


@dataclass(frozen=True)
class Choice:
    """A fetcher by name and, for the impersonating one, its profile (`firefox/mobile`)."""

    fetcher: str = ""
    profile: str = ""


def parse_spec(spec: str, platform: str = "pc") -> Choice:
    """`pycurl`, `urllib3`, `requests`, `impersonate` or `impersonate:<browser>[/<form>]` as a Choice
    for an endpoint of `platform`; a clear ValueError names what is wrong."""
    name, _, browser = spec.strip().partition(":")
    name = name.strip().lower()
    FETCHERS.get(name)  # UnknownNameError (a KeyError) with a "did you mean"
    if name == PYCURL and not installed():
        raise ValueError(MISSING)
    if name != IMPERSONATE:
        if browser:
            raise ValueError(f"fetcher {name!r} takes no browser profile (got {spec!r})")
        return Choice(name)
    p = Profile.parse(browser, platform_family(platform))
    return Choice(name, f"{p.family}/{p.form}")


def choose(declared: str, site: str, platform: str) -> Choice:
    """The fetcher of an endpoint's requests: `CHAINCRAWL_FETCHER_<SITE>`, else the endpoint's
    `fetcher=`, else the process's (an empty Choice)."""
    env = site_env("fetcher", site)  # read each time: a process may set it while it runs
    return _choice(env or declared, site, platform, bool(env))


@functools.lru_cache(maxsize=512)
def _choice(spec: str, site: str, platform: str, from_env: bool) -> Choice:
    """A spec parsed once a process (a page asks for its endpoint's fetcher every time)."""
    if not spec:
        return Choice()
    try:
        return parse_spec(spec, platform)
    except (UnknownNameError, ValueError) as exc:
        where = SITE_VARS["fetcher"].name(site) if from_env else f"{site}'s endpoint fetcher="
        raise ConfigError(f"{where}: {exc}") from None


class FetcherSet:
    """The fetchers of one process by name, each built on first use; a request goes to the
    one it names (`FetchRequest.fetcher`), else to `default`."""

    def __init__(self, default: str = DEFAULT, options: FetcherOptions | None = None) -> None:
        self.default = default
        self.options = options or FetcherOptions()
        if default not in FETCHERS:
            raise ConfigError(
                f"CHAINCRAWL_FETCHER: {UnknownNameError('fetcher', default, FETCHERS.names())}"
            )
        self._built: dict[str, Fetcher] = {}
        self._lock = threading.Lock()
        if default == PYCURL and not installed():  # at the worker's start, not on a page
            raise ConfigError(f"CHAINCRAWL_FETCHER: {MISSING}")

    def get(self, name: str = "") -> Fetcher:
        """The fetcher called `name` ("": the default), built once."""
        name = name or self.default
        f = self._built.get(name)
        if f is None:
            with self._lock:
                f = self._built.get(name)
                if f is None:
                    f = self._built[name] = FETCHERS.get(name)(self.options)
        return f

    def fetch(self, req: FetchRequest) -> Response:
        return self.get(req.fetcher).fetch(req)


def default_fetcher(
    max_redirects: int = 10,
    kind: str = DEFAULT,
    slots: int = 0,
    cache: HttpCache | None = None,
    ca_bundle: str = "",
) -> Fetcher:
    """The fetchers workers use (`CHAINCRAWL_FETCHER` names the default one: pycurl, the
    default, urllib3, requests or impersonate), limited to `slots` requests in flight when that is set
    (`CHAINCRAWL_FETCH_SLOTS`), behind the development HTTP cache when one is given
    (`HttpCache.from_settings()`)."""
    inner: Fetcher = FetcherSet(kind, FetcherOptions(max_redirects, ca_bundle))
    if slots > 0:
        inner = LimitedFetcher(inner, slots)
    return CachingFetcher(inner, cache) if cache is not None else inner


def settings_fetcher(s: Settings) -> Fetcher:
    """`default_fetcher` as the settings ask for it: what a worker's runtime fetches through."""
    cache = HttpCache.from_settings(s)
    return default_fetcher(s.max_redirects, s.fetcher, s.fetch_slots, cache, s.ca_bundle)
