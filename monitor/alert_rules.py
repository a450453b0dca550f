"""Alert rules: their kinds, their YAML syntax and where it is read from.

`load_config` reads `alerts.yaml` at the project root by default (`CHAINCRAWL_ALERTS_FILE`
names another, `CHAINCRAWL_ALERTS_RULES` holds inline YAML, `CHAINCRAWL_ALERTS_WEBHOOK` and
`CHAINCRAWL_ALERTS_INTERVAL` override). The syntax is in docs/monitoring.md; what the evaluator
does with the rules is in monitor/alerts.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from config import ROOT
from settings.monitor import AlertSettings, get_alert_settings

KINDS = {
    "failure_rate": "failed / (succeeded + failed) per task (by: site sums a site) over window",
    "retry_rate": "retried / started per task (or site) over window",
    "pool_size": "members usable now, per pool",
    "pool_bans": "members banned now, per pool",
    "queue_depth": "messages waiting, per queue",
    "queue_growth": "depth now minus depth `window` ago, per queue (with min_depth)",
    "outbox_backlog": "items waiting for storage",
    "outbox_age": "age in seconds of the oldest item waiting for storage",
    "dead_letters": "tasks dead-lettered within window",
    "workers": "workers answering a ping",
    "run_idle": "seconds since a run with tasks outstanding last finished one (not paused)",
    "run_resending": "tasks of a run the sweeper re-sent since the run last finished one",
    "fleet_shortage": "share of its fleet entitlement a site with a backlog runs at, per site",
    "sink_failing": "1 per sink whose last write failed (disk full, sink down), from the first "
    "failed write until one succeeds",
    "queue_unserved": "messages waiting in a queue no live worker consumes, per queue",
    "module_broken": "processes (live workers, the monitor) that failed to import a site or "
    "chain module, per module",
    "slots_lost": "runs paused on a slot range of the cluster no node serves (a master and its "
    "replicas down), per range",
}
RATE_KINDS = ("failure_rate", "retry_rate")


_DUR = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(value: Any) -> float:
    """Seconds from 90, "90", "90s", "5m", "1h30m"."""
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip().replace(" ", "")
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DUR.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {value!r} (use seconds or e.g. 30s, 5m, 1h)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


@dataclass
class Rule:
    name: str
    kind: str
    above: float | None = None
    below: float | None = None
    window: float = 300.0
    hold: float = 0.0  # `for` in YAML
    by: str = "task"
    match: str = "*"
    min_events: int = 1
    min_depth: int = 0
    severity: str = "warning"
    description: str = ""

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> Rule:
        known = {
            "name",
            "kind",
            "above",
            "below",
            "window",
            "for",
            "by",
            "match",
            "min_events",
            "min_depth",
            "severity",
            "description",
        }
        unknown = set(d) - known
        name = str(d.get("name") or "")
        if not name:
            raise ValueError(f"alert rule without a name: {dict(d)}")
        if unknown:
            raise ValueError(f"alert rule {name!r}: unknown keys {sorted(unknown)}")
        kind = str(d.get("kind") or "")
        if kind not in KINDS:
            raise ValueError(
                f"alert rule {name!r}: kind must be one of {sorted(KINDS)}, not {kind!r}"
            )
        if (d.get("above") is None) == (d.get("below") is None):
            raise ValueError(f"alert rule {name!r}: give exactly one of `above` or `below`")
        by = str(d.get("by", "task"))
        if by not in ("task", "site"):
            raise ValueError(f"alert rule {name!r}: by must be task or site")
        return cls(
            name=name,
            kind=kind,
            above=float(d["above"]) if d.get("above") is not None else None,
            below=float(d["below"]) if d.get("below") is not None else None,
            window=duration(d.get("window", 300)),
            hold=duration(d.get("for", 0)),
            by=by,
            match=str(d.get("match", "*")),
            min_events=int(d.get("min_events", 1)),
            min_depth=int(d.get("min_depth", 0)),
            severity=str(d.get("severity", "warning")),
            description=str(d.get("description", "")),
        )

    def breached(self, value: float | None) -> bool:
        if value is None:
            return False
        return value > self.above if self.above is not None else value < self.below  # type: ignore[operator]

    @property
    def threshold(self) -> dict[str, float]:
        return {"above": self.above} if self.above is not None else {"below": self.below}  # type: ignore[dict-item]


@dataclass
class AlertConfig:
    rules: list[Rule] = field(default_factory=list)
    webhook: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    interval: float = 15.0
    timeout: float = 5.0
    max_attempts: int = 10
    source: str = ""

    @property
    def max_window(self) -> float:
        return max([r.window for r in self.rules] or [0.0])


def parse_config(data: Any, source: str = "") -> AlertConfig:
    if data is None:
        data = {}
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, dict):
        raise ValueError(f"{source or 'alert config'}: expected a mapping with `rules`")
    hook = data.get("webhook") or ""
    headers: dict[str, str] = {}
    if isinstance(hook, dict):
        headers = {str(k): str(v) for k, v in (hook.get("headers") or {}).items()}
        hook = hook.get("url") or ""
    rules = [Rule.parse(r) for r in data.get("rules") or []]
    names = [r.name for r in rules]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"{source or 'alert config'}: duplicate rule names {sorted(dup)}")
    return AlertConfig(
        rules=rules,
        webhook=str(hook),
        headers=headers,
        interval=duration(data.get("interval", 15)),
        timeout=duration(data.get("timeout", 5)),
        max_attempts=int(data.get("max_attempts", 10)),
        source=source,
    )


def load_config(path: str | Path | None = None, env: AlertSettings | None = None) -> AlertConfig:
    """The rules file (or inline rules), with CHAINCRAWL_ALERTS_* overrides applied."""
    env = env or get_alert_settings()
    data: Any = {}
    source = ""
    p = Path(path or env.file or ROOT / "alerts.yaml")
    if path or env.file or p.exists():
        if not p.exists():
            raise ValueError(f"alerts file {p} does not exist")
        data = yaml.safe_load(p.read_text()) or {}
        source = str(p)
    if env.rules:
        inline = yaml.safe_load(env.rules)
        if isinstance(inline, list):
            data = {**(data if isinstance(data, dict) else {}), "rules": inline}
        else:
            data = inline
        source = "CHAINCRAWL_ALERTS_RULES"
    cfg = parse_config(data, source)
    if env.webhook:
        cfg.webhook = env.webhook
    if env.interval:
        cfg.interval = duration(env.interval)
    return cfg


def rules_table(cfg: AlertConfig) -> Iterable[tuple[str, str, str, str, str]]:
    for r in cfg.rules:
        limit = f"> {r.above:g}" if r.above is not None else f"< {r.below:g}"
        windowed = r.kind in (*RATE_KINDS, "queue_growth", "dead_letters")
        yield r.name, r.kind, limit, f"{r.window:g}s" if windowed else "-", f"{r.hold:g}s"
