"""A watched set: the item type whose stored values are watched for change, which field keys
them, which step re-crawls a key, and the budget its visits are planned within.

It is written by the schedule entry that declares it (`by_change:` in schedules.yaml, each
tick of its trigger) into the state store, so every worker's outbox drainer knows which stored
items to observe without reading the schedule file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from scheduling.recrawl.model import Knobs


@dataclass(frozen=True)
class Watch:
    """`name`: the schedule entry's; `site`: the re-crawling step's site (whose budget it is);
    `item_type`, `key`: the stored items watched and their field naming the key; `param`: the
    re-crawling step's parameter the key goes into; `fields`: the fields whose change counts
    (empty: the whole item but the key)."""

    name: str
    site: str
    item_type: str
    key: str
    param: str
    fields: tuple[str, ...]
    knobs: Knobs

    def key_of(self, item: Mapping[str, Any]) -> str | None:
        value = item.get(self.key)
        return None if value is None else str(value)

    def value_of(self, item: Mapping[str, Any]) -> Any:
        """What a change is judged on: the watched fields (all but the key when none given)."""
        if self.fields:
            return [item.get(f) for f in self.fields]
        return {k: v for k, v in item.items() if k != self.key}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fields"] = list(self.fields)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Watch:
        knobs = Knobs(**d["knobs"])
        return cls(
            name=str(d["name"]),
            site=str(d["site"]),
            item_type=str(d["item_type"]),
            key=str(d["key"]),
            param=str(d["param"]),
            fields=tuple(d.get("fields") or ()),
            knobs=knobs,
        )
