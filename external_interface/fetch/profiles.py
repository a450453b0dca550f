"""Browser identities for the impersonating fetcher: who a request claims to be, and the
headers, in order, that such a browser sends.

One rule keeps a request from contradicting itself: **the user agent wins**. A user agent lent
by a provider (a device's, a rotation's) names the browser, its version, its operating system
and whether it is a phone; the TLS handshake and HTTP/2 settings (the impersonation target) and
every browser header (`sec-ch-ua*`, `Accept`, `Sec-Fetch-*`, their order) follow it. Without a
lent user agent the endpoint's profile decides (`impersonate:safari`, the platform choosing
desktop or mobile), and the request carries that browser's own user agent. A user agent that
is no browser's (an app's `okhttp/4.12.0`) keeps the app's few headers over the TLS of the
platform's mobile browser, never a browser header it would not send.

Pure functions of strings: nothing here imports the HTTP client, so the choice of target and
headers is tested without a network.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

FAMILIES = ("chrome", "edge", "firefox", "safari")
FORMS = ("desktop", "mobile", "app")
# platform family (external_interface.resources.user_agent.family) -> the form it impersonates
FORM_OF_PLATFORM = {"pc": "desktop", "h5": "mobile", "app": "app"}
DEFAULT_FAMILY = "chrome"

ACCEPT_DOCUMENT = {
    "chrome": "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,"
    "image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7",
    "firefox": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "safari": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
}
ACCEPT_ENCODING = {"chrome": "gzip, deflate, br, zstd", "firefox": "gzip, deflate, br, zstd",
                   "safari": "gzip, deflate, br", "app": "gzip"}  # fmt: skip
ACCEPT_LANGUAGE = {"chrome": "en-US,en;q=0.9", "firefox": "en-US,en;q=0.5",
                   "safari": "en-US,en;q=0.9"}  # fmt: skip

# The order each engine writes its headers in (lower-case names; HTTP/2 sends them so). A
# header a request brings that is not listed goes after these, in the request's own order.
ORDER = {
    "chrome": ("sec-ch-ua", "sec-ch-ua-mobile", "sec-ch-ua-platform", "upgrade-insecure-requests",
               "user-agent", "accept", "content-type", "origin", "sec-fetch-site",
               "sec-fetch-mode", "sec-fetch-user", "sec-fetch-dest", "referer",
               "accept-encoding", "accept-language", "cookie", "priority"),
    "firefox": ("user-agent", "accept", "accept-language", "accept-encoding", "content-type",
                "origin", "referer", "cookie", "upgrade-insecure-requests", "sec-fetch-dest",
                "sec-fetch-mode", "sec-fetch-site", "sec-fetch-user", "priority", "te"),
    "safari": ("sec-fetch-dest", "user-agent", "accept", "content-type", "origin",
               "sec-fetch-site", "sec-fetch-mode", "referer", "accept-language", "priority",
               "accept-encoding", "cookie"),
}  # fmt: skip
# How HTTP/1.1 spells them (a browser on plain http); HTTP/2 lower-cases every name anyway.
_TITLE = {"sec-ch-ua": "sec-ch-ua", "sec-ch-ua-mobile": "sec-ch-ua-mobile",
          "sec-ch-ua-platform": "sec-ch-ua-platform", "te": "TE"}  # fmt: skip


@dataclass(frozen=True)
class Identity:
    """The browser a request is sent as. `version` is the major version (Safari: major * 10 +
    minor, as curl_cffi names its targets: 17.4 -> 174); `browser` is False for an app's own
    HTTP client."""

    family: str  # chrome, edge, firefox, safari ("app" for a non-browser client)
    version: int
    mobile: bool
    os: str  # Windows, macOS, Linux, Android, iOS, Chrome OS ("" unknown)
    user_agent: str
    browser: bool = True

    @property
    def engine(self) -> str:
        """Whose headers and handshake: Edge is Chromium's."""
        return "chrome" if self.family == "edge" else self.family


@dataclass(frozen=True)
class Profile:
    """What an endpoint or a site asked for (`impersonate`, `impersonate:firefox`) on its
    platform: the browser family and the form (desktop, mobile, or an app's client)."""

    family: str = DEFAULT_FAMILY
    form: str = "desktop"

    @classmethod
    def parse(cls, spec: str, platform_family: str = "pc") -> Profile:
        """`chrome`, `firefox`, `safari` or `edge`, optionally `/desktop`, `/mobile` or `/app`;
        without a form the platform's (pc desktop, h5 mobile, app app). A clear ValueError
        names what is wrong."""
        family, _, form = (spec or DEFAULT_FAMILY).strip().lower().partition("/")
        family = family or DEFAULT_FAMILY
        if family not in FAMILIES:
            raise ValueError(
                f"unknown browser profile {spec!r}: choose from {', '.join(FAMILIES)}, "
                f"optionally /{'|/'.join(FORMS)}"
            )
        form = form or FORM_OF_PLATFORM.get(platform_family, "desktop")
        if form not in FORMS:
            raise ValueError(f"unknown form {form!r} in profile {spec!r}: choose from {FORMS}")
        return cls(family, form)


# -- parsing a user agent -----------------------------------------------------------------

_CHROME = re.compile(r"(?:Chrome|CriOS)/(\d+)")
_EDGE = re.compile(r"Edg(?:e|A|iOS)?/(\d+)")
_FIREFOX = re.compile(r"(?:Firefox|FxiOS)/(\d+)")
_SAFARI = re.compile(r"Version/(\d+)(?:\.(\d+))?")


def parse_user_agent(ua: str) -> Identity | None:
    """The browser a user agent names, or None when it names none (an app's client).

    Every browser on iOS is WebKit underneath (Chrome's `CriOS`, Firefox's `FxiOS`): its
    handshake is Safari's, so it is Safari here."""
    if not ua.startswith("Mozilla/5.0"):
        return None
    os_name = _os_of(ua)
    mobile = "Mobile" in ua  # Android tablets leave it out, as their browsers do
    if os_name == "iOS":
        m = _SAFARI.search(ua) or re.search(r"OS (\d+)_(\d+)", ua)
        version = _safari_version(m.group(1), m.group(2)) if m else 170
        return Identity("safari", version, True, "iOS", ua)
    if m := _EDGE.search(ua):
        return Identity("edge", int(m.group(1)), mobile, os_name, ua)
    if m := _FIREFOX.search(ua):
        return Identity("firefox", int(m.group(1)), mobile, os_name, ua)
    if m := _CHROME.search(ua):
        return Identity("chrome", int(m.group(1)), mobile, os_name, ua)
    if "Safari/" in ua and (m := _SAFARI.search(ua)):
        return Identity("safari", _safari_version(m.group(1), m.group(2)), mobile, os_name, ua)
    return None


def _safari_version(major: str, minor: str | None) -> int:
    return int(major) * 10 + int(minor or 0)


def _os_of(ua: str) -> str:
    if "iPhone" in ua or "iPad" in ua or "iPod" in ua:
        return "iOS"
    if "Android" in ua:
        return "Android"
    if "Windows" in ua:
        return "Windows"
    if "CrOS" in ua:
        return "Chrome OS"
    if "Macintosh" in ua or "Mac OS X" in ua:
        return "macOS"
    if "Linux" in ua or "X11" in ua:
        return "Linux"
    return ""


# -- a profile's own identity --------------------------------------------------------------

# the versions a profile's own user agent claims when no user agent is lent: the newest of
# each family that curl_cffi 0.17 impersonates on every form
OWN_VERSION = {"chrome": 131, "edge": 131, "firefox": 135, "safari": 180}


def own_identity(profile: Profile) -> Identity:
    """The identity a profile sends as when no user agent is lent: its browser's own user
    agent, desktop or phone by the form (an app form sends as the phone's browser)."""
    fam = profile.family
    v = OWN_VERSION[fam]
    mobile = profile.form != "desktop"
    if fam == "safari":
        major, minor = divmod(v, 10)
        if mobile:
            ua = (
                f"Mozilla/5.0 (iPhone; CPU iPhone OS {major}_{minor} like Mac OS X) "
                f"AppleWebKit/605.1.15 (KHTML, like Gecko) Version/{major}.{minor} "
                "Mobile/15E148 Safari/604.1"
            )
            return Identity("safari", v, True, "iOS", ua)
        ua = (
            f"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 "
            f"(KHTML, like Gecko) Version/{major}.{minor} Safari/605.1.15"
        )
        return Identity("safari", v, False, "macOS", ua)
    if fam == "firefox":
        if mobile:
            ua = f"Mozilla/5.0 (Android 14; Mobile; rv:{v}.0) Gecko/{v}.0 Firefox/{v}.0"
            return Identity("firefox", v, True, "Android", ua)
        ua = f"Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:{v}.0) Gecko/20100101 Firefox/{v}.0"
        return Identity("firefox", v, False, "Windows", ua)
    edge = f" Edg/{v}.0.0.0" if fam == "edge" else ""
    if mobile:
        ua = (
            f"Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) "
            f"Chrome/{v}.0.0.0 Mobile Safari/537.36{edge.replace('Edg/', 'EdgA/')}"
        )
        return Identity(fam, v, True, "Android", ua)
    ua = (
        f"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
        f"Chrome/{v}.0.0.0 Safari/537.36{edge}"
    )
    return Identity(fam, v, False, "Windows", ua)


def identity_for(profile: Profile, user_agent: str | None) -> Identity:
    """Who the request is sent as: the lent user agent's browser when it names one (the user
    agent wins), else the profile's own; an app's non-browser client keeps its user agent."""
    if user_agent:
        found = parse_user_agent(user_agent)
        if found is not None:
            return found
        own = own_identity(Profile(profile.family, "mobile"))
        return Identity("app", own.version, True, own.os, user_agent, browser=False)
    return own_identity(profile)


# -- the impersonation target ---------------------------------------------------------------

_TARGET = re.compile(r"^(chrome|firefox|safari)(\d+)(_android|_ios)?$")


def target_for(ident: Identity, targets: Iterable[str]) -> str:
    """The curl_cffi target closest to the identity: its engine's, of its form (a phone's
    when the library has one), the newest whose version is at most the identity's (else the
    oldest). An app's client gets the TLS of the phone's browser it runs beside."""
    engine = "chrome" if ident.engine == "app" else ident.engine
    mobile_suffix = {"chrome": "_android", "safari": "_ios"}.get(engine, "")
    mobile = ident.mobile and bool(mobile_suffix)
    found: list[tuple[int, str]] = []
    for name in targets:
        m = _TARGET.match(name)
        if not m or m.group(1) != engine:
            continue
        if bool(m.group(3)) != mobile:
            continue
        digits = m.group(2)
        version = int(digits[:2]) * 10 + int(digits[2]) if engine == "safari" else int(digits)
        if engine == "safari" and len(digits) != 3:
            continue  # safari2601 (26.0.1): its 26.0 sibling stands for it
        found.append((version, name))
    if not found:
        if mobile:  # no phone target of this engine: its desktop one
            return target_for(Identity(engine, ident.version, False, "", ""), targets)
        raise ValueError(f"no impersonation target for {engine} among the library's targets")
    found.sort()
    below = [n for v, n in found if v <= ident.version]
    return below[-1] if below else found[0][1]


# -- the headers ----------------------------------------------------------------------------


def sec_ch_ua(ident: Identity) -> str:
    """Chromium's brand list for its major version, as Chromium computes it (the greased
    brand and the order permuted by the version), so it agrees with the user agent."""
    v = ident.version
    chars = (" ", "(", ":", "-", ".", "/", ")", ";", "=", "?", "_")
    grease = f"Not{chars[v % 11]}A{chars[(v + 1) % 11]}Brand"
    grease_v = "24" if v >= 130 else "99"
    brand = "Microsoft Edge" if ident.family == "edge" else "Google Chrome"
    order = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))[v % 6]
    slots = [""] * 3
    slots[order[0]] = f'"{grease}";v="{grease_v}"'
    slots[order[1]] = f'"Chromium";v="{v}"'
    slots[order[2]] = f'"{brand}";v="{v}"'
    return ", ".join(slots)


def browser_headers(
    ident: Identity, method: str, headers: Mapping[str, str] | None, title_case: bool = True
) -> list[tuple[str, str]]:
    """The request's headers as `ident` sends them: its own (client hints, Accept,
    Sec-Fetch-*, encodings, language) in its engine's order, the request's values winning
    over its defaults by name, headers it does not know appended in the request's order.

    A document load (a GET without an `Accept` of its own, or one asking for HTML) carries
    the navigation headers; anything else (an API call: `Accept: application/json`, a POST)
    those of a script's `fetch()`. Cookies are not here: the fetcher sends them (one
    `Cookie` header with those a redirect sets)."""
    given = {k.lower(): (k, v) for k, v in (headers or {}).items() if k.lower() != "cookie"}
    if not ident.browser:
        app = [("user-agent", ident.user_agent), ("accept-encoding", ACCEPT_ENCODING["app"])]
        out = [given.pop(k, (k, v)) for k, v in app]
        return list(given.values()) + out
    engine = ident.engine
    accept = given.get("accept", ("", ""))[1]
    document = method.upper() == "GET" and (not accept or "text/html" in accept)
    own: dict[str, str] = {"user-agent": ident.user_agent}
    if engine == "chrome":
        own["sec-ch-ua"] = sec_ch_ua(ident)
        own["sec-ch-ua-mobile"] = "?1" if ident.mobile else "?0"
        own["sec-ch-ua-platform"] = f'"{ident.os or "Windows"}"'
    own["accept"] = ACCEPT_DOCUMENT[engine] if document else "*/*"
    own["accept-encoding"] = ACCEPT_ENCODING[engine]
    own["accept-language"] = ACCEPT_LANGUAGE[engine]
    if document:
        own |= {
            "upgrade-insecure-requests": "1",
            "sec-fetch-site": "none",
            "sec-fetch-mode": "navigate",
            "sec-fetch-user": "?1",
            "sec-fetch-dest": "document",
            "priority": "u=0, i",
        }
        if engine == "safari":
            del own["upgrade-insecure-requests"], own["sec-fetch-user"]
    else:
        own |= {
            "sec-fetch-site": "same-origin",
            "sec-fetch-mode": "cors",
            "sec-fetch-dest": "empty",
            "priority": "u=1, i" if engine != "firefox" else "u=4",
        }
    if engine == "firefox":
        own["te"] = "trailers"
    out = []
    for name in ORDER[engine]:
        if name in given:
            out.append(given.pop(name))
        elif name in own:
            out.append((_spell(name, title_case), own[name]))
    return out + list(given.values())


def _spell(name: str, title_case: bool) -> str:
    if not title_case:
        return name
    return _TITLE.get(name) or "-".join(p.capitalize() for p in name.split("-"))


def header_lines(pairs: Sequence[tuple[str, str]]) -> list[bytes]:
    """`Name: value` lines for the HTTP client (latin-1, as HTTP/1.1 headers are)."""
    return [f"{k}: {v}".encode("latin-1", "replace") for k, v in pairs]
