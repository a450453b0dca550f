"""Storage facade: which sinks each item type goes to, and the sink registry.

Items reach storage only through the outbox drainer (`external_interface.storage.outbox`), which hands
each sink one item type at a time together with the *origin* of every item (the outbox stream
entry it came in). Sinks must be idempotent: the drainer may hand the same entry again after a
crash, an outage or a race with another drainer, and a sink either upserts by the type's unique
key (MongoDB, HTTP) or skips entries it already holds (JSON Lines). What sinks share (the
`Sink` interface, errors, origins, key sanitising, policies) is in
`external_interface.storage.sinks.base`. The registry names each sink by its module path
(`SinkPlugin`): a sink's module is imported when that sink is first built, so a process that
only declares item types (a triggering script) imports none of them.

Routing: every item type goes to the default sinks (`settings.sinks`, e.g. "jsonl,mongo")
unless a per-type policy names its own. Policies come from code (`configure_type`) and from
the environment, which wins:

    CHAINCRAWL_SINK_ROUTES="demo.post=jsonl,mongo;shop.*=mongo"   sinks per type (fnmatch)
    CHAINCRAWL_TRACK_HISTORY="demo.post=likes,comments"           fields whose versions the
                                                                  sinks keep (field history)
    CHAINCRAWL_SEARCH_FIELDS="demo.post=title,content"            fields the postgres sink
                                                                  indexes for text search

An `Item` class declares the same in code (`history_fields`, `search_fields`): its definition
calls `configure_type` for its type.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from config import Settings, get_settings
from exceptions import ConfigError
from external_interface.storage.sinks.base import (
    SANITIZE_MAP,
    Origin,
    PermanentSinkError,
    Policies,
    Sink,
    SinkError,
    TypePolicy,
    entry_version,
    key_values,
    restore_keys,
    safe_name,
    sanitize_key,
    sanitize_keys,
)
from utils.modules import load_object
from utils.registry import Registry, UnknownNameError

__all__ = [  # the shared types are re-exported: this module is where users meet storage
    "SANITIZE_MAP",
    "Origin",
    "PermanentSinkError",
    "Policies",
    "Sink",
    "SinkError",
    "SinkFactory",
    "SinkPlugin",
    "SinkRouter",
    "TypePolicy",
    "build_sinks",
    "check_sinks",
    "configure_type",
    "entry_version",
    "key_values",
    "restore_keys",
    "safe_name",
    "sanitize_key",
    "sanitize_keys",
    "sink_registry",
    "split_names",
    "type_policies",
]

log = logging.getLogger(__name__)


type_policies = Policies()  # filled by code (endpoint modules) through configure_type()


def configure_type(
    pattern: str,
    *,
    sinks: Iterable[str] | None = None,
    track: Iterable[str] | None = None,
    history_limit: int | None = None,
    search: Iterable[str] | None = None,
) -> None:
    """Declare how an item type (or a glob of types) is stored; the environment still wins."""
    changes: dict[str, Any] = {}
    if search is not None:
        changes["search"] = tuple(search)
    if sinks is not None:
        changes["sinks"] = tuple(sinks)
    if track is not None:
        changes["track"] = tuple(track)
    if history_limit is not None:
        changes["history_limit"] = history_limit
    type_policies.set(pattern, **changes)


# --- registry and routing ----------------------------------------------------------------

SinkFactory = Callable[[Settings, Policies], Sink]
sink_registry: Registry[SinkFactory] = Registry("sink")


class SinkPlugin:
    """A sink's factory named by its class's path, `"package.module:Class"`: the module is
    imported (and the class's `from_settings` called) when the sink is first built."""

    def __init__(self, path: str, *, policies: bool = True) -> None:
        self.path = path
        self.policies = policies  # whether from_settings takes the type policies

    def load(self) -> Any:
        return load_object(self.path)

    def __call__(self, settings: Settings, policies: Policies) -> Sink:
        cls = self.load()
        sink: Sink = (
            cls.from_settings(settings, policies) if self.policies else cls.from_settings(settings)
        )
        return sink

    def __repr__(self) -> str:
        return f"SinkPlugin({self.path!r})"


_SINKS = "external_interface.storage.sinks"
for _name, _plugin in {
    "jsonl": SinkPlugin(f"{_SINKS}.jsonl:JsonlSink"),
    "mongo": SinkPlugin(f"{_SINKS}.mongo:MongoSink"),
    "postgres": SinkPlugin(f"{_SINKS}.postgres:PostgresSink"),
    "http": SinkPlugin(f"{_SINKS}.http:HttpSink", policies=False),
    "kafka": SinkPlugin(f"{_SINKS}.kafka:KafkaSink", policies=False),
}.items():
    sink_registry.add(_name, _plugin)


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
    settings = settings or get_settings()
    default = list(names) if names is not None else split_names(settings.sinks)
    if not default:
        raise ConfigError("no sinks configured (CHAINCRAWL_SINKS is empty)")
    policies = (policies or type_policies).copy().update_from_env()
    wanted = _wanted(default, policies)
    instances = {n: sink_registry.get(n)(settings, policies) for n in wanted}
    return SinkRouter(instances, default, policies)


def _wanted(default: Sequence[str], policies: Policies) -> list[str]:
    """The default sinks, then each sink a per-type rule names, once each."""
    wanted = list(dict.fromkeys(default))
    for policy in policies.rules.values():
        wanted += [n for n in policy.sinks or () if n not in wanted]
    return wanted


def check_sinks(settings: Settings | None = None, policies: Policies | None = None) -> None:
    """A `ConfigError` naming the setting that asks for a sink no factory is registered under
    (`CHAINCRAWL_SINKS`, or a per-type rule: `CHAINCRAWL_SINK_ROUTES` or `configure_type`),
    with its "did you mean"; builds nothing. `start` runs it before any worker: a drainer
    whose sinks fail to build stores nothing, and the runs would wait in `storing` for ever."""
    settings = settings or get_settings()
    default = split_names(settings.sinks)
    if not default:
        raise ConfigError("CHAINCRAWL_SINKS is empty: no sink would store the items")
    policies = (policies or type_policies).copy().update_from_env()
    for name in _wanted(default, policies):
        if name not in sink_registry:
            where = (
                "CHAINCRAWL_SINKS"
                if name in default
                else "a per-type sink rule (CHAINCRAWL_SINK_ROUTES or configure_type)"
            )
            try:
                sink_registry.get(name)
            except UnknownNameError as exc:
                raise ConfigError(f"{where}: {exc}") from None
