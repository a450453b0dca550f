"""Per-site variables: settings a deployment sets per site (keys, accounts, agents, pool tuning).

Their names are built from the site (`CHAINCRAWL_SIGN_KEY_DEMO`), so they cannot be fields of
a settings class. Each family is declared here once, read through `site_env`, and checked
against the sites that exist by `settings/envcheck.py` (a misspelled site or family is
reported, never silently ignored).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from settings.base import PREFIX


@dataclass(frozen=True)
class SiteVar:
    """One family of per-site variables.

    `template` names the site-level variable with `{site}` and any other `{part}`; `default`
    (optional) names the variable for every site. Values are upper-cased into the name.
    `parts` lists the allowed values of a part (None: any); `secret` keeps the value out of
    every listing.
    """

    template: str
    description: str
    default: str | None = None
    parts: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    secret: bool = False

    def name(self, site: str, **parts: str) -> str:
        return PREFIX + self.template.format(site=site, **parts).upper()

    def default_name(self, **parts: str) -> str | None:
        return PREFIX + self.default.format(**parts).upper() if self.default else None


SITE_VARS: dict[str, SiteVar] = {
    "base_url": SiteVar(
        "BASE_URL_{site}",
        "Where the site lives, over the default its `base_url()` holds (a mirror, a local "
        "copy; `control.sh new-site --base-url` writes the default).",
    ),
    "accounts": SiteVar(
        "ACCOUNTS_{site}",
        "Accounts of the site's login producer: `user:password` entries, comma-separated "
        "(else var/accounts/<site>.json|txt).",
        secret=True,
    ),
    "fetcher": SiteVar(
        "FETCHER_{site}",
        "The fetcher of the site's requests over its endpoints' own `fetcher=`: pycurl, "
        "urllib3, requests, impersonate or impersonate:<browser>[/<form>] (docs/browser.md).",
    ),
    "contact_url": SiteVar(
        "CONTACT_URL_{site}",
        "The URL in the default User-Agent, `chaincrawl/VERSION (+URL)`, sent when no user "
        "agent is lent: where the site's owner reads who crawls it (default: the project's).",
        default="CONTACT_URL",
    ),
    "sign_key": SiteVar("SIGN_KEY_{site}", "The site's request-signing key.", secret=True),
    "user_agents": SiteVar(
        "UA_{site}_{family}",
        "JSON list of user agents of the site for one platform family.",
        parts={"family": ("pc", "h5", "app")},
    ),
    "captcha": SiteVar(
        "CAPTCHA_{site}",
        "Captcha recognizer of the site (a name in external_interface.resources.captcha.recognizers).",
        default="CAPTCHA",
    ),
    "captcha_service": SiteVar(
        "CAPTCHA_SERVICE_{field}_{site}",
        "The `http` captcha recognizer's service: URL, KEY (secret), TIMEOUT seconds.",
        default="CAPTCHA_SERVICE_{field}",
        parts={"field": ("url", "key", "timeout")},
        secret=True,
    ),
    "pool": SiteVar(
        "POOL_{kind}_{site}",
        'JSON object of a resource pool\'s settings ({"low_water": 3}), over the kind-wide '
        "`CHAINCRAWL_POOL_<KIND>` (external_interface/resources/pool.py).",
        default="POOL_{kind}",
        parts={"kind": None},
    ),
}


def site_env(
    key: str, site: str, environ: Mapping[str, str] | None = None, **parts: str
) -> str | None:
    """A per-site variable's value: the site's own, else the family's all-sites default.

    An empty value counts as unset. The process's environment is read on every call (a
    process may set a variable while it runs), without what `os.environ.get` costs a missing
    name (every page asks for its site's fetcher and contact URL, usually unset)."""
    if environ is None and _RAW is not None and not parts:
        names = _NAMES.get((key, site))
        if names is None:
            names = _NAMES[(key, site)] = _raw_names(SITE_VARS[key], site)
        for raw in names:
            value = _RAW.get(raw)
            if value:
                return _decode(value)
        return None
    var = SITE_VARS[key]
    env = os.environ if environ is None else environ
    for name in (var.name(site, **parts), var.default_name(**parts)):
        if name and env.get(name):
            return env[name]
    return None


# os.environ's own store (POSIX: bytes names and values, kept in step by os.environ and
# os.putenv's callers through it): a dict lookup instead of `_Environ.__getitem__`'s encode
# and KeyError. Elsewhere (or another implementation) the plain lookup above.
_RAW: dict[Any, Any] | None = getattr(os.environ, "_data", None) if os.name == "posix" else None
_NAMES: dict[tuple[str, str], tuple[bytes, ...]] = {}


def _raw_names(var: SiteVar, site: str) -> tuple[bytes, ...]:
    names = (var.name(site), var.default_name())
    return tuple(os.fsencode(n) for n in names if n)


def _decode(value: bytes) -> str:
    return os.fsdecode(value)
