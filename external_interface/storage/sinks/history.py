"""Field history: the versions of the fields an item type tracks, shared by every sink.

A sink records *observations*: a tracked field's value in one stored write, with the write's
time and version (the outbox entry). Versions are what a reader gets: consecutive observations
of equal value collapse into one version, valid from its first observation until the next
version's, the last one open (`valid_to` None):

    observations (likes): 3 @ t1, 3 @ t2, 5 @ t3, 8 @ t4
    versions:             3 [t1, t3), 5 [t3, t4), 8 [t4, ...)

Collapsing at read time makes recording order-free: an entry stored late (claimed after an
outage), a redelivered one (same version: one observation) or two drainers racing on a key
never leave two open versions or a gap, whatever order the observations were written in.

The time of an observation is its outbox entry's: the commit of the page that yielded the
item (entry ids are milliseconds of the Redis clock), so every sink holding the same writes
holds the same intervals; a write without an entry is observed at the time it was written.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from external_interface.storage.sinks.base import Origin

MISSING: Any = object()  # a field the item does not have (not recorded)


@dataclass(frozen=True)
class Observation:
    """One stored write's value of one tracked field."""

    field: str
    value: Any
    version: int  # the entry's version (sinks.base.entry_version), or the write's time in ns
    entry: str = ""


@dataclass(frozen=True)
class Version:
    """One value a field held, and when: [valid_from, valid_to), `valid_to` None while current."""

    key: tuple[Any, ...]
    field: str
    value: Any
    valid_from: datetime
    valid_to: datetime | None
    entry: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": list(self.key),
            "field": self.field,
            "value": self.value,
            "valid_from": self.valid_from.isoformat(),
            "valid_to": self.valid_to.isoformat() if self.valid_to else None,
            "entry": self.entry,
        }


def version_of(origin: Origin) -> int:
    """An observation's version: its entry's, or now in nanoseconds (a write without one)."""
    v = origin.version
    return v if v is not None else time.time_ns()


def version_time(version: int) -> datetime:
    """A version as a time: entry versions are ms * 1e6 + seq, i.e. nanoseconds as well."""
    return datetime.fromtimestamp(version / 1e9, UTC)


def field_value(doc: Any, path: str) -> Any:
    """`doc`'s value at a dotted path, or MISSING."""
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return MISSING
        doc = doc[part]
    return doc


def key_text(value: Any) -> str:
    """A key value as text, the same in every sink and on the command line: strings as they
    are, numbers and booleans as JSON writes them (`5`, `true`), times in ISO 8601."""
    if isinstance(value, str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    return orjson.dumps(value).decode()


def observe(
    item: dict[str, Any], fields: Sequence[str], version: int, entry: str = ""
) -> list[Observation]:
    """The observations one stored item makes of the tracked `fields` it has."""
    out = []
    for f in fields:
        v = field_value(item, f)
        if v is not MISSING:
            out.append(Observation(f, v, version, entry))
    return out


def versions(key: Sequence[Any], observations: Iterable[Observation]) -> list[Version]:
    """Collapse one key's observations into versions, per field (fields in first-seen order,
    versions oldest first). Observations with the same version count once."""
    by_field: dict[str, dict[int, Observation]] = {}
    for o in observations:
        by_field.setdefault(o.field, {}).setdefault(o.version, o)
    out: list[Version] = []
    k = tuple(key)
    for f, seen in by_field.items():
        runs: list[Observation] = []  # each version's first observation
        for o in sorted(seen.values(), key=lambda o: o.version):
            if not runs or runs[-1].value != o.value:
                runs.append(o)
        for i, o in enumerate(runs):
            end = version_time(runs[i + 1].version) if i + 1 < len(runs) else None
            out.append(Version(k, f, o.value, version_time(o.version), end, o.entry))
    return out
