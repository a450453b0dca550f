"""The limits of `CHAINCRAWL_LIMITS`: one scope's rate and concurrency cap, the inline and
YAML/JSON syntax that gives them (docs/scheduling.md), and the defaults for sites without an
entry (`CHAINCRAWL_DEFAULT_LIMITS`) and for their render scopes (`CHAINCRAWL_BROWSER_SITE_LIMIT`).
`scheduling/gate.py` enforces them."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config import Settings, get_settings
from exceptions import ConfigError
from settings.browser import BrowserSettings, get_browser_settings


@dataclass(frozen=True)
class Limit:
    """One scope's limits: `rate` requests per second (with `burst` back to back after idle
    time), at most `max` tasks in flight, each lease living `lease` seconds unless renewed."""

    scope: str
    rate: float | None = None
    burst: int = 1
    max: int | None = None
    lease: float | None = None

    def describe(self) -> str:
        parts = []
        if self.rate is not None:
            parts.append(f"{self.rate:g}/s" + (f" burst {self.burst}" if self.burst > 1 else ""))
        if self.max is not None:
            parts.append(f"max {self.max} in flight")
        if self.lease is not None:
            parts.append(f"lease {self.lease:g}s")
        return ", ".join(parts)


_SCOPE = re.compile(r"^(\*|[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|sec|m|min|h|hour)$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h)?$")
_UNIT = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600}
_HINT = "expected a rate (20/s, 600/m, 5/10s), a cap (8 or max=8), burst=N or lease=DURATION"


def parse_rate(text: str) -> float:
    """`20/s`, `600/m`, `5/10s`, `1/2.5h` -> requests per second."""
    m = _RATE.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a rate like 20/s, 600/m or 5/10s")
    n, per, unit = float(m.group(1)), float(m.group(2) or 1), _UNIT[m.group(3)]
    if n <= 0 or per <= 0:
        raise ValueError(f"rate {text!r} must be positive")
    return n / (per * unit)


def parse_duration(text: str | float) -> float:
    """`30`, `30s`, `500ms`, `2m`, `1h` -> seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _DURATION.match(str(text).strip())
        if not m:
            raise ValueError(f"{text!r} is not a duration like 30s, 500ms, 2m")
        value = float(m.group(1)) * _UNIT[m.group(2) or "s"]
    if value <= 0:
        raise ValueError(f"duration {text!r} must be positive")
    return value


def _positive_int(text: Any, what: str) -> int:
    try:
        n = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a whole number") from None
    if n < 1:
        raise ValueError(f"{what} must be at least 1, got {n}")
    return n


def _limit_from_terms(scope: str, terms: list[str]) -> Limit:
    fields: dict[str, Any] = {}

    def put(name: str, value: Any, term: str) -> None:
        if name in fields:
            raise ValueError(f"{name} given twice ({term!r})")
        fields[name] = value

    for term in (t.strip() for t in terms):
        if not term:
            continue
        key, eq, value = term.partition("=")
        key = key.strip().lower()
        if not eq:
            if term.isdigit():
                put("max", _positive_int(term, "max"), term)
            elif "/" in term:
                put("rate", parse_rate(term), term)
            else:
                raise ValueError(f"{term!r}: {_HINT}")
        elif key == "rate":
            put("rate", parse_rate(value), term)
        elif key in ("max", "concurrency"):
            put("max", _positive_int(value, "max"), term)
        elif key == "burst":
            put("burst", _positive_int(value, "burst"), term)
        elif key == "lease":
            put("lease", parse_duration(value), term)
        else:
            raise ValueError(f"unknown setting {key!r} in {term!r}: {_HINT}")
    return _limit(scope, fields)


def _limit(scope: str, fields: Mapping[str, Any]) -> Limit:
    if not _SCOPE.match(scope):
        raise ValueError(f"scope {scope!r} is not a site or task name (demo, demo.h5.feed) or *")
    if fields.get("rate") is None and fields.get("max") is None:
        raise ValueError("gives neither a rate (20/s) nor a concurrency cap (max=8)")
    if "burst" in fields and fields.get("rate") is None:
        raise ValueError("burst needs a rate")
    return Limit(scope=scope, **fields)


def parse_limits(text: str, source: str = "CHAINCRAWL_LIMITS") -> dict[str, Limit]:
    """Inline syntax: `scope=term,term; scope=term` (or one entry per line; # comments)."""
    limits: dict[str, Limit] = {}
    lines = (ln.split("#", 1)[0] for ln in text.splitlines())
    entries = [e.strip() for ln in lines for e in ln.split(";")]
    for entry in filter(None, entries):
        scope, eq, rest = entry.partition("=")
        scope = scope.strip()
        try:
            if not eq:
                raise ValueError("expected scope=limits, e.g. demo=20/s,8")
            if scope in limits:
                raise ValueError(f"scope {scope!r} appears twice")
            limits[scope] = _limit_from_terms(scope, rest.split(","))
        except ValueError as exc:
            raise ConfigError(f"{source}: entry {entry!r}: {exc}") from None
    return limits


def limits_from_mapping(data: Any, source: str) -> dict[str, Limit]:
    """A YAML/JSON document: `{scope: "20/s,8"}` or `{scope: {rate: 20/s, max: 8, ...}}`,
    optionally under a top-level `limits:` key."""
    if isinstance(data, Mapping) and set(data) == {"limits"}:
        data = data["limits"]
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: expected a mapping of scope -> limits, got {type(data).__name__}"
        )
    limits: dict[str, Limit] = {}
    for scope, spec in data.items():
        scope = str(scope).strip()
        try:
            if isinstance(spec, str):
                limits[scope] = _limit_from_terms(scope, spec.split(","))
            elif isinstance(spec, int) and not isinstance(spec, bool):
                limits[scope] = _limit(scope, {"max": _positive_int(spec, "max")})
            elif isinstance(spec, Mapping):
                terms = [f"{k}={v}" for k, v in spec.items()]
                limits[scope] = _limit_from_terms(scope, terms)
            else:
                raise ValueError(f"expected '20/s,8' or a mapping, got {spec!r}")
        except ValueError as exc:
            raise ConfigError(f"{source}: entry {scope!r}: {exc}") from None
    return limits


def load_limits(value: str | None = None) -> dict[str, Limit]:
    """Limits from `value` (default: CHAINCRAWL_LIMITS): inline entries (they always hold `=`),
    else the path of a YAML or JSON file (`.json` is read as JSON; a leading `@` is allowed)."""
    if value is None:
        value = configured_limits()
    value = value.strip()
    if not value:
        return {}
    if "=" in value and not value.startswith("@"):
        return parse_limits(value)
    path = Path(value.removeprefix("@")).expanduser()
    if not path.is_file():
        raise ConfigError(f"CHAINCRAWL_LIMITS names a file that does not exist: {path}")
    text = path.read_text()
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"limits file {path}: invalid JSON: {exc}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"limits file {path}: invalid YAML: {exc}") from None
    return limits_from_mapping(data, f"limits file {path}")


def configured_limits(settings: Settings | None = None) -> str:
    """The raw limits setting (CHAINCRAWL_LIMITS)."""
    return (settings or get_settings()).limits


OFF = frozenset(("", "off", "none", "no", "false", "0"))


def is_off(value: str) -> bool:
    """Whether a limits setting's value means "no limits" (`off`, `none`, empty...)."""
    return value.strip().lower() in OFF


def _every_site(value: str, variable: str) -> Limit | None:
    """A setting holding the terms of one limits entry for every site (None when `off`)."""
    raw = value.strip()
    if is_off(raw):
        return None
    try:
        return _limit_from_terms("*", raw.split(","))
    except ValueError as exc:
        raise ConfigError(f"{variable}: {raw!r}: {exc}") from None


def default_limit(settings: Settings | None = None) -> Limit | None:
    """`CHAINCRAWL_DEFAULT_LIMITS` as a `*` entry (None when `off`): the limits of every site
    without an entry of its own, unless `CHAINCRAWL_LIMITS` gives a `*` itself."""
    raw = (settings or get_settings()).default_limits
    return _every_site(raw, "CHAINCRAWL_DEFAULT_LIMITS")


def render_limit(browser: BrowserSettings | None = None) -> Limit | None:
    """`CHAINCRAWL_BROWSER_SITE_LIMIT`: the limit of every site's `<site>.render` scope that
    `CHAINCRAWL_LIMITS` does not name (None when `off`)."""
    raw = (browser or get_browser_settings()).site_limit
    return _every_site(raw, "CHAINCRAWL_BROWSER_SITE_LIMIT")


def effective_limits(settings: Settings | None = None) -> dict[str, Limit]:
    """The limits workers obey: `CHAINCRAWL_LIMITS`, plus the default `*` entry when that
    setting has none (`control.sh limits` prints these)."""
    s = settings or get_settings()
    limits = load_limits(configured_limits(s))
    if "*" not in limits:
        default = default_limit(s)
        if default is not None:
            limits["*"] = default
    return limits
