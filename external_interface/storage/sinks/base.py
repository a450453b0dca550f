"""What every sink shares: the `Sink` interface, its errors, where an item came from, key
sanitising, and the per-type storage policies.

Sink modules import this and nothing else of storage; `external_interface.storage.routing` imports the
sinks (to register them by name) and routes item types to them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from exceptions import ChainCrawlError, ConfigError
from settings.storage import StorageSettings, get_storage_settings

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

    # stream entry id "ms-seq" ("<run id>/ms-seq" on a Redis Cluster, where each run has its
    # own stream); "" for direct writes (no idempotency token)
    entry: str = ""
    run: str = ""
    step: str = ""
    task: str = ""

    @property
    def version(self) -> int | None:
        """The entry id as one sortable integer: later commits win over earlier ones."""
        return entry_version(self.entry) if self.entry else None


def entry_version(entry_id: str | bytes) -> int:
    """`"1700000000000-3"` -> 1700000000000000003 (ms * 1e6 + seq, seq capped at 999999); an
    id of a run's stream on a cluster, `"<run id>/1700000000000-3"`, by the part after `/`."""
    if isinstance(entry_id, bytes):
        entry_id = entry_id.decode()
    ms, _, seq = entry_id.rpartition("/")[2].partition("-")
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
    track: tuple[str, ...] = ()  # fields (dotted paths allowed) whose versions are kept
    history_limit: int = 100  # mongo: newest versions kept per field in `_history`
    search: tuple[str, ...] = ()  # fields the postgres sink indexes for full-text search


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

    def update_from_env(self, environ: Mapping[str, str] | None = None) -> Policies:
        """Apply SINK_ROUTES, TRACK_HISTORY and SEARCH_FIELDS (of `environ` when given, else
        this process's settings); the environment wins over code."""
        s = get_storage_settings() if environ is None else StorageSettings.from_environ(environ)
        for pattern, names in _parse_map(s.sink_routes):
            self.set(pattern, sinks=tuple(names))
        for pattern, names in _parse_map(s.track_history):
            self.set(pattern, track=tuple(names))
        for pattern, names in _parse_map(s.search_fields):
            self.set(pattern, search=tuple(names))
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
