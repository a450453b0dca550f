"""Does a request look like the browser its user agent names? The guard's judgement, from
the ClientHello (`hello.py`), the client's HTTP/2 SETTINGS and the request's headers in the
order they came.

What a browser's request has that a script's lacks, per engine (as Chrome 131, Firefox 135 and
Safari 18 send them, and curl_cffi's targets of them):

| engine | TLS | HTTP/2 pseudo-headers | SETTINGS_INITIAL_WINDOW_SIZE | headers |
|---|---|---|---|---|
| Chromium (Chrome, Edge) | GREASE | `:method :authority :scheme :path` | 6291456 | `sec-ch-ua` that names the user agent's version, before `user-agent` |
| Firefox | `record_size_limit`, no GREASE | `:method :path :authority :scheme` | 131072 | `user-agent` first, no `sec-ch-ua` |
| Safari | GREASE | `:method :scheme :path :authority` (up to 18), `:method :scheme :authority :path` (26) | 2097152 or 4194304 | no `sec-ch-ua` |

Any of them contradicting the user agent (a Chrome handshake under a Firefox user agent, a
`sec-ch-ua` of another version) is refused too: a real browser never does that.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from demo.guard.hello import Hello

PSEUDO_ORDER = {
    "chrome": (("method", "authority", "scheme", "path"),),
    "firefox": (("method", "path", "authority", "scheme"),),
    "safari": (
        ("method", "scheme", "path", "authority"),
        ("method", "scheme", "authority", "path"),
    ),
}
INITIAL_WINDOW = {"chrome": (6291456,), "firefox": (131072,), "safari": (2097152, 4194304)}
SETTINGS_INITIAL_WINDOW_SIZE = 4


def engine_of(user_agent: str) -> tuple[str, int] | None:
    """(engine, major version) a browser's user agent names, or None."""
    if not user_agent.startswith("Mozilla/5.0"):
        return None
    if "iPhone" in user_agent or "iPad" in user_agent:
        return "safari", 0
    if m := re.search(r"Firefox/(\d+)", user_agent):
        return "firefox", int(m.group(1))
    if m := re.search(r"Chrome/(\d+)", user_agent):
        return "chrome", int(m.group(1))
    if "Safari/" in user_agent and "Version/" in user_agent:
        return "safari", 0
    return None


def judge(
    hello: Hello | None,
    settings: Mapping[int, int] | None,
    headers: Sequence[tuple[str, str]],
) -> str | None:
    """None when the request looks like the browser its user agent names, else why not.
    `settings` is None for an HTTP/1.1 connection."""
    if settings is None:
        return "HTTP/2 required"
    regular = [(k.lower(), v) for k, v in headers if not k.startswith(":")]
    names = [k for k, _ in regular]
    values = dict(regular)
    found = engine_of(values.get("user-agent", ""))
    if found is None:
        return "not a browser's user agent"
    engine, version = found
    if hello is None:
        return "no TLS ClientHello seen"
    if engine == "firefox":
        if hello.grease or not hello.record_size_limit:
            return "the TLS handshake is not Firefox's"
    elif not hello.grease:
        return f"the TLS handshake is not {engine.capitalize()}'s"
    pseudo = tuple(k[1:] for k, _ in headers if k.startswith(":"))
    if pseudo not in PSEUDO_ORDER[engine]:
        return f"the HTTP/2 pseudo-header order {' '.join(pseudo)} is not {engine}'s"
    window = settings.get(SETTINGS_INITIAL_WINDOW_SIZE)
    if window not in INITIAL_WINDOW[engine]:
        return f"the HTTP/2 initial window {window} is not {engine}'s"
    hints = values.get("sec-ch-ua")
    if engine == "chrome":
        if not hints or f'"Chromium";v="{version}"' not in hints:
            return "sec-ch-ua does not name the user agent's Chromium"
        if names.index("sec-ch-ua") > names.index("user-agent"):
            return "sec-ch-ua comes after user-agent"
        mobile = "?1" if "Mobile" in values["user-agent"] else "?0"
        if values.get("sec-ch-ua-mobile") != mobile:
            return "sec-ch-ua-mobile contradicts the user agent"
    elif hints is not None:
        return f"{engine} sends no sec-ch-ua"
    elif engine == "firefox" and names and names[0] != "user-agent":
        return "Firefox sends user-agent first"
    return None
