"""The health record every resource pool reports (proxies, cookies, device ids, ...).

One record per pool, the same shape for every kind, so the exporter, `control.sh status` and
the alert rules treat all pools alike (`monitor.health` collects them):

    PoolHealth(name="cookie:demo", size=12, bans=3, produced=40)

    name      "{kind}:{site}" for per-site pools, "{kind}" for a global pool
    size      members usable now (gauge)
    bans      members banned or cooling down now (gauge)
    produced  members ever added to the pool (counter: harvested, logged in, generated)
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

STALE_AFTER = 300.0  # seconds after which a pushed report is flagged as stale


@dataclass
class PoolHealth:
    name: str
    size: int
    bans: int = 0
    produced: int = 0
    kind: str = ""
    site: str = ""
    updated: float = field(default_factory=time.time)
    source: str = "live"  # live (asked now) | report (pushed earlier)

    def __post_init__(self) -> None:
        head, _, tail = self.name.partition(":")
        self.kind = self.kind or head
        self.site = self.site or tail

    @property
    def age(self) -> float:
        return max(0.0, time.time() - self.updated)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["age"] = round(self.age, 1)
        d["stale"] = self.source == "report" and self.age > STALE_AFTER
        return d
