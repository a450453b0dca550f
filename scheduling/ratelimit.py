"""Shared rate limits and concurrency caps, held in Redis and obeyed by every worker together.

Limits are configured per site, per platform or per endpoint (a dotted prefix of the task
name) in `CHAINCRAWL_LIMITS`, inline or as a YAML/JSON file (syntax: docs/scheduling.md):

    CHAINCRAWL_LIMITS="demo=20/s,8; demo.h5.feed=5/s; *=10/s"

A task passes every limit whose scope is a prefix of its name (`demo` and `demo.h5.feed` for
`demo.h5.feed`); `*` is the default for each site that has no entry of its own.

Rate = a GCRA token bucket (one key per scope: the "theoretical arrival time" in microseconds
of Redis server time). A request reserves its slot atomically on every scope it passes and
sleeps until then; waits beyond `max_sleep` reserve nothing and raise `Throttled`, so the
task gives its worker slot back. Because requests are spaced by reservation, not by polling,
the combined rate of any number of workers stays at the limit.

Concurrency = leases: a sorted set per scope of task ids scored by expiry time. The admit
script purges expired leases first, so a SIGKILLed worker's slots come back after the lease
TTL; every request renews the running task's leases, so a live task never loses its slot.
Every script reads the clock with `TIME` inside Redis: workers on different machines agree.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config import Settings, get_settings
from exceptions import ConfigError, Throttled
from scheduling.gate import gates
from utils.redis import get_redis

LEASE_MARGIN = 15.0  # seconds a default lease outlives the task deadline (hard limit is +15)
TINY_WAIT = 0.05  # admit waits this short are slept inside the worker, not re-queued

_LUA_HEAD = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function fmt(x) return string.format('%.0f', x) end
"""

# KEYS: lease zsets (n_lease), then rate keys (n_rate)
# ARGV: 1 task id, 2 n_lease, 3 n_rate, 4 max wait (us),
#       then per lease key: cap, ttl (us); then per rate key: interval (us), tolerance (us)
# Returns {0, backlog_us} admitted | {1, 0} a cap is full | {2, backlog_us} rate backlog too long
_ADMIT = (
    _LUA_HEAD
    + """
local tid, nl, nr, max_wait = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 1, nl do
  local key, cap = KEYS[i], tonumber(ARGV[3 + 2 * i])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
  if not redis.call('ZSCORE', key, tid) and redis.call('ZCARD', key) >= cap then
    return {1, 0}
  end
end
local backlog = 0
local base = 4 + 2 * nl
for j = 1, nr do
  local tat = tonumber(redis.call('GET', KEYS[nl + j]) or '0')
  local w = tat - tonumber(ARGV[base + 2 * j]) - now
  if w > backlog then backlog = w end
end
if backlog > max_wait then return {2, backlog} end
for i = 1, nl do
  local ttl = tonumber(ARGV[4 + 2 * i])
  redis.call('ZADD', KEYS[i], fmt(now + ttl), tid)
  redis.call('PEXPIRE', KEYS[i], math.ceil(ttl / 1000) + 60000)
end
return {0, backlog}
"""
)

# KEYS: rate keys (n_rate), then lease zsets (n_lease) of the running task
# ARGV: 1 task id, 2 n_rate, 3 n_lease, 4 max wait (us),
#       then per rate key: interval (us), tolerance (us); then per lease key: ttl (us)
# Returns {0, wait_us} reserved: send after wait_us | {1, wait_us} too long, nothing reserved
_TOKEN = (
    _LUA_HEAD
    + """
local tid, nr, nl, max_wait = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tats = {}
local wait = 0
for j = 1, nr do
  local tat = tonumber(redis.call('GET', KEYS[j]) or '0')
  if tat < now then tat = now end
  tats[j] = tat
  local w = tat - tonumber(ARGV[4 + 2 * j]) - now
  if w > wait then wait = w end
end
if wait > max_wait then return {1, wait} end
local go = now + wait
for j = 1, nr do
  local tat = math.max(tats[j], go) + tonumber(ARGV[3 + 2 * j])
  redis.call('SET', KEYS[j], fmt(tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
end
local base = 4 + 2 * nr
for i = 1, nl do
  if tid ~= '' then
    local ttl = tonumber(ARGV[base + i])
    if redis.call('ZADD', KEYS[nr + i], 'XX', 'CH', fmt(now + ttl), tid) == 1 then
      redis.call('PEXPIRE', KEYS[nr + i], math.ceil(ttl / 1000) + 60000)
    end
  end
end
return {0, wait}
"""
)


# --- configuration -----------------------------------------------------------------------


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
    """The raw limits setting (a `limits` Settings field once config.py has one, else env)."""
    s = settings or get_settings()
    return str(getattr(s, "limits", "") or os.environ.get("CHAINCRAWL_LIMITS", ""))


def _seconds(settings: Settings, field: str, default: float) -> float:
    """A Settings field once config.py has it, else env CHAINCRAWL_<FIELD>, else the default."""
    value = getattr(settings, field, None)
    if value is not None:
        return float(value)
    name = f"CHAINCRAWL_{field.upper()}"
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None


# --- the gate ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """What one endpoint must pass: its lease keys and its rate keys, precomputed."""

    lease_keys: tuple[str, ...]
    lease_args: tuple[int, ...]  # cap, ttl_us per lease key
    lease_ttls: tuple[int, ...]
    rate_keys: tuple[str, ...]
    rate_args: tuple[int, ...]  # interval_us, tolerance_us per rate key

    @property
    def empty(self) -> bool:
        return not self.lease_keys and not self.rate_keys


class RedisGate:
    """The `redis` gate: every worker shares the limits through two Lua scripts.

    `max_sleep` (env CHAINCRAWL_GATE_MAX_SLEEP, default 1 s): the longest a request waits for
    its token inside the task; longer waits re-queue the task. `retry` (CHAINCRAWL_GATE_RETRY,
    default 0.5 s): the countdown, with jitter, of a task refused by a full concurrency cap.
    """

    def __init__(
        self,
        limits: Mapping[str, Limit] | None = None,
        *,
        settings: Settings | None = None,
        client: Any = None,
        max_sleep: float | None = None,
        retry: float | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        s = self.settings
        self.limits = dict(load_limits(configured_limits(s)) if limits is None else limits)
        self.r = client or get_redis(s.redis_url)
        self.max_sleep = _seconds(s, "gate_max_sleep", 1.0) if max_sleep is None else max_sleep
        self.retry = _seconds(s, "gate_retry", 0.5) if retry is None else retry
        self._admit = self.r.register_script(_ADMIT)
        self._token = self.r.register_script(_TOKEN)
        self._plans: dict[str, _Plan] = {}
        self._local = threading.local()

    # scopes and keys

    def scopes(self, site: str, endpoint: str) -> list[Limit]:
        """Every configured limit the endpoint passes, broadest first."""
        parts = endpoint.split(".")
        names = [".".join(parts[: i + 1]) for i in range(len(parts))]
        if site not in names:
            names.insert(0, site)
        found = [self.limits[n] for n in names if n in self.limits]
        if site not in self.limits and "*" in self.limits:
            found.insert(0, dataclasses.replace(self.limits["*"], scope=site))
        return found

    def key(self, scope: str, kind: str) -> str:
        return self.settings.key("gate", scope, kind)

    def _plan(self, site: str, endpoint: str) -> _Plan:
        plan = self._plans.get(endpoint)
        if plan is not None:
            return plan
        lease_keys: list[str] = []
        lease_args: list[int] = []
        ttls: list[int] = []
        rate_keys: list[str] = []
        rate_args: list[int] = []
        for lim in self.scopes(site, endpoint):
            if lim.max is not None:
                ttl = _us(lim.lease or self._default_lease(endpoint))
                lease_keys.append(self.key(lim.scope, "leases"))
                lease_args += [lim.max, ttl]
                ttls.append(ttl)
            if lim.rate is not None:
                interval = 1.0 / lim.rate
                rate_keys.append(self.key(lim.scope, "tat"))
                rate_args += [_us(interval), _us(interval * (lim.burst - 1))]
        plan = _Plan(
            tuple(lease_keys), tuple(lease_args), tuple(ttls), tuple(rate_keys), tuple(rate_args)
        )
        self._plans[endpoint] = plan
        return plan

    def _default_lease(self, endpoint: str) -> float:
        """Longer than the task can live: its deadline plus the hard time limit's margin."""
        deadline = None
        try:
            from base_task import ENDPOINTS

            if endpoint in ENDPOINTS:
                deadline = ENDPOINTS.get(endpoint).deadline
        except ImportError:
            pass
        return (deadline or self.settings.task_deadline) + LEASE_MARGIN

    # the Gate interface

    def admit(self, site: str, endpoint: str, task_id: str) -> float:
        """0.0 when the task may run now (its leases taken), else seconds to wait first."""
        plan = self._plan(site, endpoint)
        if plan.empty:
            return 0.0
        keys = [*plan.lease_keys, *plan.rate_keys]
        args = [task_id, len(plan.lease_keys), len(plan.rate_keys), _us(self.max_sleep),
                *plan.lease_args, *plan.rate_args]  # fmt: skip
        for _ in range(3):
            status, backlog_us = self._admit(keys=keys, args=args)
            if status == 0:
                self._local.task_id = task_id
                return 0.0
            if status == 1:
                wait = self.retry * random.uniform(0.5, 1.5)
            else:  # come back when the backlog has drained to about half of max_sleep
                wait = max(0.0, backlog_us / 1e6 - self.max_sleep / 2) * random.uniform(1.0, 1.3)
            if wait >= TINY_WAIT:
                return wait
            time.sleep(wait)
        return TINY_WAIT

    def before_request(self, site: str, endpoint: str) -> None:
        """Take a token on every rate scope (sleeping until its slot), renew the task's leases;
        raise Throttled when the slot is further away than max_sleep."""
        plan = self._plan(site, endpoint)
        if plan.empty:
            return
        tid = getattr(self._local, "task_id", "") or ""
        keys = [*plan.rate_keys, *plan.lease_keys]
        args = [tid, len(plan.rate_keys), len(plan.lease_keys), _us(self.max_sleep),
                *plan.rate_args, *plan.lease_ttls]  # fmt: skip
        status, wait_us = self._token(keys=keys, args=args)
        wait = wait_us / 1e6
        if status != 0:
            retry_after = max(TINY_WAIT, wait - self.max_sleep / 2) * random.uniform(1.0, 1.3)
            raise Throttled(
                f"{endpoint}: next request slot in {wait:.2f}s (over its shared rate limit)",
                retry_after=retry_after,
            )
        if wait > 0:
            time.sleep(wait)

    def release(self, site: str, endpoint: str, task_id: str) -> None:
        plan = self._plan(site, endpoint)
        if getattr(self._local, "task_id", None) == task_id:
            self._local.task_id = ""
        if plan.lease_keys:
            pipe = self.r.pipeline(transaction=False)
            for key in plan.lease_keys:
                pipe.zrem(key, task_id)
            pipe.execute()

    # inspection (control.sh limits, tests)

    def usage(self) -> list[dict[str, Any]]:
        """Per configured scope: its limits, leases held now, seconds of reserved backlog."""
        now_s, now_us = self.r.time()
        now = now_s * 1_000_000 + now_us
        rows = []
        for lim in self.limits.values():
            in_flight = None
            if lim.scope == "*":  # held under each site's own keys
                rows.append(
                    {"scope": "*", "limits": lim.describe(), "in_flight": None, "backlog": 0.0}
                )
                continue
            if lim.max is not None:
                in_flight = self.r.zcount(self.key(lim.scope, "leases"), now, "+inf")
            backlog = 0.0
            if lim.rate is not None:
                tat = int(float(self.r.get(self.key(lim.scope, "tat")) or 0))
                backlog = max(0.0, (tat - now) / 1e6)
            rows.append({"scope": lim.scope, "limits": lim.describe(), "in_flight": in_flight,
                         "backlog": round(backlog, 3)})  # fmt: skip
        return rows


def _us(seconds: float) -> int:
    return math.ceil(seconds * 1_000_000)


gates.add("redis", RedisGate)
