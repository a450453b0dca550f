"""Storage facade: the `Sink` protocol, the sink registry, per-type routing, key sanitising.

Items reach storage only through the outbox drainer (`external_interface.outbox`), which hands
each sink one item type at a time together with the *origin* of every item (the outbox stream
entry it came in). Sinks must be idempotent: the drainer may hand the same entry again after a
crash, an outage or a race with another drainer, and a sink either upserts by the type's unique
key (MongoDB, HTTP) or skips entries it already holds (JSON Lines).

Routing: every item type goes to the default sinks (`settings.sinks`, e.g. "jsonl,mongo")
unless a per-type policy names its own. Policies come from code (`configure_type`) and from
the environment, which wins:

    CHAINCRAWL_SINK_ROUTES="demo.post=jsonl,mongo;shop.*=mongo"   sinks per type (fnmatch)
    CHAINCRAWL_TRACK_HISTORY="demo.post=likes,comments"           fields whose changes MongoDB
                                                                  records in `_history`
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from exceptions import ChainCrawlError, ConfigError
from utils.registry import Registry

if TYPE_CHECKING:
    from config import Settings

log = logging.getLogger(__name__)


# --- errors ------------------------------------------------------------------------------


class SinkError(ChainCrawlError):
    """A sink could not store a batch; transient (outage): the drainer retries with backoff."""

    def __init__(self, message: str, sink: str = "") -> None:
        super().__init__(message)
        self.sink = sink


class PermanentSinkError(SinkError):
    """The *data* cannot be stored (too large, rejected by the receiver); retrying won't help.

    The drainer isolates the offending entry and moves it to the dead-letter stream instead of
    blocking every later entry of the type behind it.
    """


# --- the protocol ------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """Where an item came from: the outbox entry (the idempotency token) and its task."""

    entry: str = ""  # stream entry id "ms-seq"; "" for direct writes (no idempotency token)
    run: str = ""
    step: str = ""
    task: str = ""

    @property
    def version(self) -> int | None:
        """The entry id as one sortable integer: later commits win over earlier ones."""
        return entry_version(self.entry) if self.entry else None


def entry_version(entry_id: str | bytes) -> int:
    """`"1700000000000-3"` -> 1700000000000000003 (ms * 1e6 + seq, seq capped at 999999)."""
    if isinstance(entry_id, bytes):
        entry_id = entry_id.decode()
    ms, _, seq = entry_id.partition("-")
    return int(ms) * 1_000_000 + min(int(seq or 0), 999_999)


@runtime_checkable
class Sink(Protocol):
    """Stores items of one type. `write` raises on failure and is idempotent per origin."""

    name: str

    def write(
        self,
        item_type: str,
        key_fields: list[str],
        items: list[dict[str, Any]],
        *,
        origins: Sequence[Origin] | None = None,
    ) -> None:
        """Store `items` (upsert by `key_fields`). `origins[i]` is where `items[i]` came from."""
        ...

    def close(self) -> None: ...


# --- key sanitising ----------------------------------------------------------------------

# Field names may come from page content (a dict of attributes, a JSON blob). MongoDB treats a
# leading "$" as an operator and "." as a path separator, and rejects NUL; we swap them for
# look-alike full-width characters so the data stays readable and `restore_keys` can undo it.
SANITIZE_MAP = {"$": "\uff04", ".": "\uff0e", "\x00": "\u2400"}  # full-width $ and ., NUL sign
_RESTORE_MAP = {v: k for k, v in SANITIZE_MAP.items()}


def sanitize_key(key: str) -> str:
    """Leading `$` -> U+FF04, every `.` -> U+FF0E, NUL -> U+2400 (see SANITIZE_MAP)."""
    if not key:
        return key
    if key[0] == "$":
        key = SANITIZE_MAP["$"] + key[1:]
    if "." in key or "\x00" in key:
        key = key.replace(".", SANITIZE_MAP["."]).replace("\x00", SANITIZE_MAP["\x00"])
    return key


def sanitize_keys(value: Any) -> Any:
    """Sanitise every dict key in `value`, recursively through dicts, lists and tuples.

    Values are never touched: they are data, not paths. Returns new containers (or `value`
    itself for scalars), so the caller's items are left as they were.
    """
    if isinstance(value, dict):
        return {sanitize_key(str(k)): sanitize_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize_keys(v) for v in value]
    return value


def restore_keys(value: Any) -> Any:
    """Undo `sanitize_keys` (lossy only for names that really contained the stand-ins)."""
    if isinstance(value, dict):
        return {_restore_key(k): restore_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restore_keys(v) for v in value]
    return value


def _restore_key(key: str) -> str:
    if key.startswith(SANITIZE_MAP["$"]):
        key = "$" + key[1:]
    for fake, real in _RESTORE_MAP.items():
        if fake != SANITIZE_MAP["$"]:
            key = key.replace(fake, real)
    return key


def safe_name(item_type: str) -> str:
    """An item type as a file/collection/topic name: `demo.post` stays, `a/../b` does not."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", item_type).strip(".")
    return name or "_"


def key_values(item: dict[str, Any], key_fields: Sequence[str]) -> tuple[Any, ...]:
    """The unique key of an item; a missing or null key field is a data error."""
    try:
        values = tuple(item[k] for k in key_fields)
    except KeyError as e:
        raise PermanentSinkError(f"item has no key field {e.args[0]!r}") from None
    if any(v is None for v in values):
        raise PermanentSinkError(f"item has a null key field ({', '.join(key_fields)})")
    return values


# --- per-type policies -------------------------------------------------------------------


@dataclass(frozen=True)
class TypePolicy:
    """How one item type is stored."""

    sinks: tuple[str, ...] | None = None  # None: the default sinks
    track: tuple[str, ...] = ()  # fields (dotted paths allowed) whose changes go to _history
    history_limit: int = 100  # newest entries kept in _history


@dataclass
class Policies:
    """Item-type patterns (exact names or fnmatch globs) -> TypePolicy; exact names win."""

    rules: dict[str, TypePolicy] = field(default_factory=dict)

    def set(self, pattern: str, **changes: Any) -> None:
        if changes.get("sinks") == ():
            raise ConfigError(f"{pattern}: an item type needs at least one sink")
        self.rules[pattern] = replace(self.rules.get(pattern, TypePolicy()), **changes)

    def for_type(self, item_type: str) -> TypePolicy:
        if item_type in self.rules:
            return self.rules[item_type]
        for pattern, policy in reversed(self.rules.items()):  # later rules win
            if fnmatch.fnmatchcase(item_type, pattern):
                return policy
        return TypePolicy()

    def copy(self) -> Policies:
        return Policies(dict(self.rules))

    def update_from_env(self, environ: dict[str, str] | None = None) -> Policies:
        env = os.environ if environ is None else environ
        for pattern, names in _parse_map(env.get("CHAINCRAWL_SINK_ROUTES", "")):
            self.set(pattern, sinks=tuple(names))
        for pattern, names in _parse_map(env.get("CHAINCRAWL_TRACK_HISTORY", "")):
            self.set(pattern, track=tuple(names))
        return self


def _parse_map(text: str) -> Iterator[tuple[str, list[str]]]:
    """`"a=x,y;b.*=z"` -> ("a", ["x", "y"]), ("b.*", ["z"])."""
    for part in text.split(";"):
        if not part.strip():
            continue
        pattern, sep, values = part.partition("=")
        if not sep or not pattern.strip():
            raise ConfigError(f"bad routing rule {part!r}: expected TYPE=NAME[,NAME...]")
        yield pattern.strip(), [v.strip() for v in values.split(",") if v.strip()]


type_policies = Policies()  # filled by code (endpoint modules) through configure_type()


def configure_type(
    pattern: str,
    *,
    sinks: Iterable[str] | None = None,
    track: Iterable[str] | None = None,
    history_limit: int | None = None,
) -> None:
    """Declare how an item type (or a glob of types) is stored; the environment still wins."""
    changes: dict[str, Any] = {}
    if sinks is not None:
        changes["sinks"] = tuple(sinks)
    if track is not None:
        changes["track"] = tuple(track)
    if history_limit is not None:
        changes["history_limit"] = history_limit
    type_policies.set(pattern, **changes)


# --- registry and routing ----------------------------------------------------------------

SinkFactory = Callable[["Settings", Policies], Sink]
sink_registry: Registry[SinkFactory] = Registry("sink")


@sink_registry.register("jsonl")
def _jsonl(settings: Settings, policies: Policies) -> Sink:
    from external_interface.sinks.jsonl import JsonlSink

    return JsonlSink.from_settings(settings)


@sink_registry.register("mongo")
def _mongo(settings: Settings, policies: Policies) -> Sink:
    from external_interface.sinks.mongo import MongoSink

    return MongoSink.from_settings(settings, policies)


@sink_registry.register("http")
def _http(settings: Settings, policies: Policies) -> Sink:
    from external_interface.sinks.http import HttpSink

    return HttpSink.from_settings(settings)


@sink_registry.register("kafka")
def _kafka(settings: Settings, policies: Policies) -> Sink:
    from external_interface.sinks.kafka import KafkaSink

    return KafkaSink.from_settings(settings)


def split_names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


class SinkRouter:
    """The sinks of one process and which of them each item type goes to."""

    def __init__(
        self,
        instances: dict[str, Sink] | Sequence[Sink],
        default: Sequence[str] | None = None,
        policies: Policies | None = None,
    ) -> None:
        if not isinstance(instances, dict):
            instances = {s.name: s for s in instances}
        self.instances = dict(instances)
        self.default = list(default) if default is not None else list(self.instances)
        self.policies = policies or Policies()
        for name in self.default:
            self._get(name)

    def _get(self, name: str) -> Sink:
        try:
            return self.instances[name]
        except KeyError:
            raise ConfigError(
                f"sink {name!r} is routed to but not built (built: {', '.join(self.instances)})"
            ) from None

    def for_type(self, item_type: str) -> list[Sink]:
        names = self.policies.for_type(item_type).sinks
        return [self._get(n) for n in (self.default if names is None else names)]

    def all(self) -> list[Sink]:
        return list(self.instances.values())

    def write(
        self,
        item_type: str,
        key_fields: list[str],
        items: list[dict[str, Any]],
        *,
        origins: Sequence[Origin] | None = None,
    ) -> None:
        """Write to every sink of the type (for scripts and tests; the drainer does it itself)."""
        for sink in self.for_type(item_type):
            sink.write(item_type, key_fields, items, origins=origins)

    def close(self) -> None:
        for sink in self.instances.values():
            try:
                sink.close()
            except Exception:  # closing is best effort; one bad sink must not hide others
                log.exception("closing sink %s failed", sink.name)


def build_sinks(
    settings: Settings | None = None,
    names: Sequence[str] | None = None,
    policies: Policies | None = None,
) -> SinkRouter:
    """Build the default sinks plus every sink a per-type rule names.

    Building never connects: a database that is down at start-up is an outage the drainer
    rides out, not a crash.
    """
    from config import get_settings

    settings = settings or get_settings()
    default = list(names) if names is not None else split_names(settings.sinks)
    if not default:
        raise ConfigError("no sinks configured (CHAINCRAWL_SINKS is empty)")
    policies = (policies or type_policies).copy().update_from_env()
    wanted = list(dict.fromkeys(default))
    for policy in policies.rules.values():
        wanted += [n for n in policy.sinks or () if n not in wanted]
    instances = {n: sink_registry.get(n)(settings, policies) for n in wanted}
    return SinkRouter(instances, default, policies)


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw.strip() else default
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None


def env_int(name: str, default: int) -> int:
    return int(env_float(name, default))


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip() or default
