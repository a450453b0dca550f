"""User agents per platform family (pc, h5, app) with rotation, and the `user_agent` provider.

An endpoint's platform (`sites/<site>/<platform>/...`) maps to a family: pc/web -> pc,
h5/m/mobile/wap -> h5, app/phone_app/android/ios -> app (anything else: pc). Each (site, family)
has a list; a site may register its own when its modules load (`register(site, family,
[...])`, e.g. its app's UA format), env `CHAINCRAWL_UA_<SITE>_<FAMILY>` (a JSON list)
overrides it, and the generic lists below serve the rest.

The provider never replaces a `User-Agent` already on the request: the device provider (which
runs first) sets the UA stored with the device, so an app request keeps its device's identity.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
from collections.abc import Iterator, Sequence

from config import SITE_VARS, site_env
from external_interface.resources.base import Outcome, OutgoingRequest, TaskState, providers

FAMILIES: dict[str, str] = {
    "pc": "pc",
    "web": "pc",
    "www": "pc",
    "h5": "h5",
    "m": "h5",
    "mobile": "h5",
    "wap": "h5",
    "app": "app",
    "phone_app": "app",
    "android": "app",
    "ios": "app",
}

GENERIC: dict[str, tuple[str, ...]] = {
    "pc": (
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/124.0.0.0 Safari/537.36",
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Version/17.4 Safari/605.1.15",
        "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:125.0) Gecko/20100101 Firefox/125.0",
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/124.0.0.0 Safari/537.36 Edg/124.0.2478.67",
    ),
    "h5": (
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 "
        "(KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
        "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/124.0.0.0 Mobile Safari/537.36",
        "Mozilla/5.0 (Linux; Android 13; SM-S911B) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/123.0.0.0 Mobile Safari/537.36",
        "Mozilla/5.0 (iPhone; CPU iPhone OS 16_6 like Mac OS X) AppleWebKit/605.1.15 "
        "(KHTML, like Gecko) CriOS/124.0.6367.88 Mobile/15E148 Safari/604.1",
    ),
    "app": ("okhttp/4.12.0",),
}

_sets: dict[tuple[str, str], tuple[str, ...]] = {}


def family(platform: str) -> str:
    return FAMILIES.get(platform.lower(), "pc")


def register(site: str, fam: str, agents: Sequence[str]) -> None:
    """A site's own user agents for a family (e.g. its app's `DemoApp/3.2.1 (...)` format)."""
    if not agents:
        raise ValueError("a user-agent set needs at least one entry")
    _sets[(site, fam)] = tuple(agents)


def agents_for(site: str, fam: str) -> tuple[str, ...]:
    raw = site_env("user_agents", site, family=fam)
    if raw:
        name = SITE_VARS["user_agents"].name(site, family=fam)
        try:
            vals = json.loads(raw)
        except ValueError:
            vals = None
        if not isinstance(vals, list) or not vals:
            raise ValueError(f"{name} must be a non-empty JSON list of user agents")
        return tuple(str(v) for v in vals)
    return _sets.get((site, fam)) or GENERIC[fam]


class Rotation:
    """Round-robin from a random start, so processes do not all begin on the same agent."""

    def __init__(self, agents: Sequence[str]) -> None:
        self.agents = tuple(agents)
        start = random.randrange(len(self.agents))
        self._it: Iterator[str] = itertools.islice(itertools.cycle(self.agents), start, None)
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            return next(self._it)


class UserAgentProvider:
    kind = "user_agent"

    def __init__(self, site: str, platform: str = "", agents: Sequence[str] | None = None) -> None:
        self.site, self.platform = site, platform
        self.family = family(platform)
        self._agents = agents
        self._rotation: Rotation | None = None

    @property
    def rotation(self) -> Rotation:
        if self._rotation is None:
            self._rotation = Rotation(self._agents or agents_for(self.site, self.family))
        return self._rotation

    def prepare(self, req: OutgoingRequest, task: TaskState) -> None:
        if not any(k.lower() == "user-agent" for k in req.headers):
            req.headers["User-Agent"] = self.rotation.next()

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: TaskState) -> None:
        return None


def user_agent(site: str, platform: str) -> str:
    """One user agent for ad-hoc requests outside the provider chain."""
    return random.choice(agents_for(site, family(platform)))


providers.add("user_agent", lambda site, platform: UserAgentProvider(site, platform))
providers.add("user_agent_app", lambda site, platform: UserAgentProvider(site, "app"))
