"""Periodic chains: a schedule file that Celery beat turns into chain runs.

    schedules:
      demo-hourly:                  # entry name: one run of it at a time
        chain: demo_social
        cron: "0 * * * *"           # or `every: 15m` (s, m, h, d); exactly one of the two
        priority: 3                 # 0..9, 9 most urgent (default CHAINCRAWL_DEFAULT_PRIORITY)
        seeds: [{}]                 # root parameters, one task each
        only_if_reachable: ${DEMO_URL:-http://127.0.0.1:8700}/   # optional precondition
      posts-by-change:              # scheduled by change instead of by clock
        step: demo.h5.detail        # or `chain:`: its root step gets each due key
        by_change: {item: demo.post, key: post_id, fields: [likes], budget: 2000/day}
        every: 1m                   # how often the scheduler looks (default 1m)

Beat only sends `resources.schedule.trigger_chain` messages (to the `resources` queue); a
worker decides there whether to start the run (scheduling/tasks.py), so a run that is still
going is never started twice, however many triggers arrive. Start beat with
`./control.sh beat [--schedule FILE]`; run exactly one beat per deployment.
Full reference: docs/scheduling.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from celery.schedules import crontab
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from config import ROOT, get_settings
from exceptions import ConfigError
from scheduling.recrawl.model import Knobs

TRIGGER_TASK = "resources.schedule.trigger_chain"
DEFAULT_SCHEDULE = ROOT / "schedules.yaml"
CRON_EXPIRES = 900.0  # a cron trigger nobody picked up within 15 min is dropped

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_EVERY = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")
_EVERY_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_BUDGET = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:/\s*(day|d|hour|h))?$")
BY_CHANGE_TICK = 60.0  # a `by_change` entry without `every` looks for due keys every minute


def parse_every(value: str | float) -> float:
    """`90`, `90s`, `15m`, `1h`, `1d` -> seconds (> 0)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        m = _EVERY.match(str(value).strip())
        if not m:
            raise ValueError(f"{value!r} is not an interval like 90s, 15m, 1h or 1d")
        seconds = float(m.group(1)) * _EVERY_UNIT[m.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"interval {value!r} must be positive")
    return seconds


def parse_cron(expr: str) -> Any:
    """A 5-field cron expression (minute hour day-of-month month day-of-week) or an alias
    such as @hourly -> celery.schedules.crontab. Day of week 0 = Sunday, as in cron."""
    text = _ALIASES.get(expr.strip().lower(), expr.strip())
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(
            f"cron {expr!r} needs 5 fields (minute hour day-of-month month day-of-week), "
            f"got {len(fields)}"
        )
    minute, hour, dom, month, dow = fields
    try:
        return crontab(
            minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow
        )
    except Exception as exc:  # celery raises ValueError / ParseException subclasses
        raise ValueError(f"cron {expr!r}: {exc}") from None


def parse_budget(value: str | float) -> float:
    """`2000`, `2000/day`, `100/h` -> pages per day (> 0)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        pages = float(value)
    else:
        m = _BUDGET.match(str(value).strip())
        if not m:
            raise ValueError(f"{value!r} is not a budget like 2000/day or 100/h")
        pages = float(m.group(1)) * (24.0 if m.group(2) in ("hour", "h") else 1.0)
    if pages <= 0:
        raise ValueError(f"budget {value!r} must be positive")
    return pages


class ByChange(BaseModel):
    """Schedule by change: every stored item of type `item` is a visit of the key in its field
    `key`; each key's next visit follows how often it changes (the change model,
    scheduling/recrawl), within `budget` pages a day. `param`: the step's parameter the key
    goes into (default: the same name as `key`); `fields`: the fields whose change counts
    (default: every field but the key)."""

    model_config = ConfigDict(extra="forbid")

    item: str
    key: str
    param: str | None = None
    fields: list[str] = Field(default_factory=list)
    budget: str | float
    min_interval: str | float = "10m"
    max_interval: str | float = "7d"
    alpha: float = Field(0.9, ge=0.5, le=1.0)

    @field_validator("budget")
    @classmethod
    def _budget(cls, v: str | float) -> str | float:
        parse_budget(v)
        return v

    @field_validator("min_interval", "max_interval")
    @classmethod
    def _intervals(cls, v: str | float) -> str | float:
        parse_every(v)
        return v

    @model_validator(mode="after")
    def _ordered(self) -> ByChange:
        if parse_every(self.min_interval) > parse_every(self.max_interval):
            raise ValueError("min_interval is longer than max_interval")
        return self

    def knobs(self) -> Knobs:
        return Knobs(
            budget=parse_budget(self.budget),
            min_interval=parse_every(self.min_interval),
            max_interval=parse_every(self.max_interval),
            alpha=self.alpha,
        )


class ScheduleEntry(BaseModel):
    """One periodic chain. `stale_after`: start anew even though the last run is still
    going once it is this old (a run whose messages were lost would block forever).
    `expires`: drop a trigger no worker picked up within this time (default: the interval,
    15 min for cron). `step` instead of `chain`: one endpoint on its own. `by_change`: the
    keys due by the change model, instead of `seeds`, at every tick (`every`, default 1m)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    chain: str | None = None
    step: str | None = None
    by_change: ByChange | None = None
    cron: str | None = None
    every: str | float | None = None
    priority: int | None = Field(None, ge=0, le=9)
    seeds: list[dict[str, Any]] = Field(default_factory=lambda: [dict[str, Any]()], min_length=1)
    enabled: bool = True
    only_if_reachable: str | None = None
    stale_after: str | float | None = None
    expires: str | float | None = None

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        if v is not None:
            parse_cron(v)
        return v

    @field_validator("every", "stale_after", "expires")
    @classmethod
    def _interval(cls, v: str | float | None) -> str | float | None:
        if v is not None:
            parse_every(v)
        return v

    @field_validator("only_if_reachable")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} is not an http(s) URL")
        return v

    @model_validator(mode="after")
    def _one_schedule(self) -> ScheduleEntry:
        if (self.chain is None) == (self.step is None):
            raise ValueError("give exactly one of `chain` or `step`")
        if self.by_change is not None:
            if self.cron is not None:
                raise ValueError(
                    "a `by_change` entry looks for due keys `every` so often, not by cron"
                )
            if self.every is None:
                self.every = BY_CHANGE_TICK
        elif (self.cron is None) == (self.every is None):
            raise ValueError("give exactly one of `cron` or `every`")
        return self

    @property
    def target(self) -> str:
        """The chain's name, or the one step's task name."""
        return self.chain or self.step or ""

    def schedule(self) -> Any:
        return parse_cron(self.cron) if self.cron is not None else timedelta(seconds=self.interval)

    @property
    def interval(self) -> float:
        return parse_every(self.every) if self.every is not None else 0.0

    @property
    def stale_seconds(self) -> float | None:
        return parse_every(self.stale_after) if self.stale_after is not None else None

    def expires_seconds(self) -> float:
        if self.expires is not None:
            return parse_every(self.expires)
        return self.interval if self.every is not None else CRON_EXPIRES

    def when(self) -> str:
        if self.by_change is not None:
            b = self.by_change
            return f"by change of {b.item}.{b.key} within {parse_budget(b.budget):g} pages/day, looking every {self.every}"
        return f"cron {self.cron!r}" if self.cron is not None else f"every {self.every}"


class Schedule(BaseModel):
    entries: list[ScheduleEntry]
    timezone: str | None = None
    source: str = ""


def expand_env(value: Any) -> Any:
    """`${NAME}` and `${NAME:-default}` in every string of the document."""
    if isinstance(value, str):
        return _ENV.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [expand_env(v) for v in value]
    if isinstance(value, dict):
        return {k: expand_env(v) for k, v in value.items()}
    return value


def load_schedule(path: str | Path | None = None) -> Schedule:
    """Read and validate a schedule file; ConfigError names the file, entry and field."""
    p = Path(path) if path else DEFAULT_SCHEDULE
    if not p.is_file():
        raise ConfigError(f"schedule file not found: {p}")
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"schedule file {p}: invalid YAML: {exc}") from None
    if not isinstance(doc, dict) or not set(doc) <= {"schedules", "timezone"}:
        raise ConfigError(
            f"schedule file {p}: expected top-level keys `schedules` (and `timezone`)"
        )
    raw = doc.get("schedules") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"schedule file {p}: `schedules` must map entry names to entries")
    entries = []
    for name, body in raw.items():
        if not isinstance(body, dict):
            raise ConfigError(f"schedule file {p}: entry {name!r} must be a mapping")
        try:
            entries.append(ScheduleEntry.model_validate({**expand_env(body), "name": str(name)}))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(x) for x in e['loc']) or 'entry'}: {e['msg'].removeprefix('Value error, ')}"
                for e in exc.errors()
            )
            raise ConfigError(f"schedule file {p}: entry {name!r}: {problems}") from None
    return Schedule(entries=entries, timezone=doc.get("timezone"), source=str(p))


def beat_schedule(schedule: Schedule) -> dict[str, dict[str, Any]]:
    """The enabled entries as Celery's `beat_schedule`: one trigger message per tick."""
    out: dict[str, dict[str, Any]] = {}
    for e in schedule.entries:
        if not e.enabled:
            continue
        out[f"chain:{e.name}"] = {
            "task": TRIGGER_TASK,
            "schedule": e.schedule(),
            "args": (e.name, e.model_dump(mode="json", exclude={"name"})),
            "options": {"queue": "resources", "expires": e.expires_seconds()},
        }
    return out


def describe(schedule: Schedule) -> list[str]:
    lines = []
    for e in schedule.entries:
        state = "" if e.enabled else "  (disabled)"
        prio = "default" if e.priority is None else e.priority
        what = f"chain {e.chain}" if e.chain else f"step {e.step}"
        seeds = "" if e.by_change else f", {len(e.seeds)} seed(s)"
        lines.append(f"{e.name}: {what}, {e.when()}, priority {prio}{seeds}{state}")
    return lines


def run_beat(
    app: Any,
    path: str | Path | None = None,
    loglevel: str = "INFO",
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Run Celery beat on `app` in this process with the schedule file's entries (blocks);
    `extra`: more beat entries (the proxy pool's harvesters and validators)."""
    schedule = load_schedule(path)
    s = get_settings()
    run_dir = s.var_dir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    app.conf.beat_schedule = {**(extra or {}), **beat_schedule(schedule)}
    if schedule.timezone:
        app.conf.timezone = schedule.timezone
    app.Beat(loglevel=loglevel, schedule=str(run_dir / "beat-schedule"), max_interval=60).run()
