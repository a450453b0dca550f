"""Alert rules: a webhook POST and a log line once per incident, and a notice on recovery.

Rules live in YAML (`alerts.yaml` at the project root by default; `CHAINCRAWL_ALERTS_FILE`
names another, `CHAINCRAWL_ALERTS_RULES` holds inline YAML). See docs/monitoring.md:

    webhook: http://127.0.0.1:9000/hook      # or CHAINCRAWL_ALERTS_WEBHOOK
    interval: 15s
    rules:
      - name: endpoint_failing
        kind: failure_rate      # per task: failed / (succeeded + failed) over the window
        window: 5m
        above: 0.2
        for: 5m                 # the condition must hold this long before it fires
        min_events: 10

The evaluator (run by `control.sh monitor`) ticks every `interval`. Its state is in Redis so
any number of monitors can run: a tick lock (`{alerts}:lock`) lets one of them evaluate
per interval, and every state change is one Lua script, which is the only place a notification
is queued: two monitors evaluating at once still queue one notice per incident. Keys (the
`{alerts}` hash tag keeps the script's keys on one Redis Cluster slot):

    {alerts}:samples  zset    JSON counter samples by time (what windowed rates need)
    {alerts}:state    hash    "{rule}|{subject}" -> JSON {state pending|firing, since...}
    {alerts}:notify   list    notifications waiting for the webhook (retried on failure)
    {alerts}:history  list    the last 1000 notifications, newest first
    monitor:workers   string  JSON {time, workers: [...]} from the evaluator's ping
"""

from __future__ import annotations

import fnmatch
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import requests
import yaml
from celery import Celery

from config import ROOT, Settings, get_settings
from monitor import health
from monitor import status as st
from monitor.fleet import describe_shortage, fleet_view
from settings.monitor import AlertSettings, get_alert_settings
from utils.keyspace import Keyspace
from utils.lua import load_lua
from utils.redis import get_redis

log = logging.getLogger("chaincrawl.alerts")

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
}
RATE_KINDS = ("failure_rate", "retry_rate")
HISTORY_MAX = 1000


# --- configuration -----------------------------------------------------------------------------

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


# --- keys ----------------------------------------------------------------------------------------


class Keys:
    """The evaluator's keys: all but `monitor:workers` share the `{alerts}` hash tag
    (`Keyspace.alerts`), so the transition script, which takes state, notify and history,
    runs on a Redis Cluster."""

    def __init__(self, s: Settings) -> None:
        ks = Keyspace(s.key_prefix)
        self.samples = ks.alerts("samples")
        self.state = ks.alerts("state")
        self.notify = ks.alerts("notify")
        self.history = ks.alerts("history")
        self.lock = ks.alerts("lock")
        self.workers = s.key("monitor", "workers")


def firing(
    client: Any, s: Settings | None = None, include_pending: bool = False
) -> list[dict[str, Any]]:
    """Current alert states (firing ones; pending too when asked), for status and the exporter."""
    k = Keys(s or get_settings())
    out = []
    for f, raw in sorted(client.hgetall(k.state).items()):
        d = orjson.loads(raw)
        if d.get("state") == "firing" or (include_pending and d.get("state") == "pending"):
            rule, _, subject = f.decode().partition("|")
            out.append({"rule": rule, "subject": subject, **d})
    return out


def history(client: Any, s: Settings | None = None, limit: int = 50) -> list[dict[str, Any]]:
    return [orjson.loads(m) for m in client.lrange(Keys(s or get_settings()).history, 0, limit - 1)]


def workers_seen(client: Any, s: Settings | None = None) -> dict[str, Any] | None:
    raw = client.get(Keys(s or get_settings()).workers)
    return orjson.loads(raw) if raw else None


# --- observations --------------------------------------------------------------------------------

TASK_FIELDS = ("succeeded", "failed", "retried", "started")


@dataclass
class Sample:
    """Cumulative counters at one moment: what windowed rates are computed from."""

    t: float
    tasks: dict[str, list[int]]
    queues: dict[str, int]
    dead: int

    def encode(self) -> bytes:
        return orjson.dumps(
            {"t": self.t, "tasks": self.tasks, "queues": self.queues, "dead": self.dead}
        )

    @classmethod
    def decode(cls, raw: bytes) -> Sample:
        d = orjson.loads(raw)
        return cls(d["t"], d["tasks"], d["queues"], d["dead"])


@dataclass
class Observation:
    sample: Sample
    pools: dict[str, health.PoolHealth]
    outbox: dict[str, Any]
    workers: list[str] | None
    idle_runs: dict[str, float] = field(default_factory=dict)  # `{chain}/{run}` -> seconds
    resending: dict[str, int] = field(default_factory=dict)  # `{chain}/{run}` -> re-sends
    fleet: list[dict[str, Any]] = field(default_factory=list)  # monitor.fleet.fleet_view rows
    broken: list[dict[str, Any]] = field(default_factory=list)  # monitor.status.broken_modules
    unserved: dict[str, int] = field(default_factory=dict)  # queue -> messages no worker takes


def observe(
    client: Any, s: Settings, now: float, ping: Callable[[], list[str] | None] | None
) -> Observation:
    tm = st.task_metrics(client, s)
    tasks = {t: [m.get(f, 0) for f in TASK_FIELDS] for t, m in tm.items()}
    broker = st.broker_client(client, s)
    sample = Sample(now, tasks, st.queue_depths(broker, s), st.dead_letters(client, s))
    pools = {h.name: h for h in health.collect(client, s)}
    return Observation(
        sample,
        pools,
        st.outbox(client, s),
        ping() if ping else None,
        st.idle_runs(client, s, now),
        st.resending_runs(client, s),
        fleet_view(client, s),
        st.broken_modules(client, s),
        st.unserved_queues(client, s, sample.queues),
    )


def _delta(
    cur: Mapping[str, list[int]], base: Mapping[str, list[int]] | None, by: str
) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for task, vals in cur.items():
        old = (base or {}).get(task, [0] * len(vals))
        d = [c - o if c >= o else c for c, o in zip(vals, old, strict=False)]  # reset -> restart
        key = st.site_of(task) if by == "site" else task
        acc = out.setdefault(key, [0] * len(vals))
        for i, v in enumerate(d):
            acc[i] += v
    return out


def rule_values(rule: Rule, obs: Observation, base: Sample | None) -> dict[str, float | None]:
    """The rule's measured value per subject (None: not enough data to judge)."""
    cur = obs.sample
    vals: dict[str, float | None] = {}
    if rule.kind in RATE_KINDS:
        if base is None:
            return {}
        for subj, (ok, failed, retried, started) in _delta(cur.tasks, base.tasks, rule.by).items():
            if rule.kind == "failure_rate":
                n, bad = ok + failed, failed
            else:
                n, bad = started, retried
            vals[subj] = bad / n if n >= max(1, rule.min_events) else None
    elif rule.kind in ("pool_size", "pool_bans"):
        for name, h in obs.pools.items():
            vals[name] = float(h.size if rule.kind == "pool_size" else h.bans)
    elif rule.kind == "queue_depth":
        vals = {q: float(n) for q, n in cur.queues.items()}
    elif rule.kind == "queue_growth":
        if base is None:
            return {}
        for q, n in cur.queues.items():
            grown = n - base.queues.get(q, 0)
            vals[q] = float(grown) if n >= rule.min_depth else None
    elif rule.kind == "outbox_backlog":
        vals["outbox"] = float(obs.outbox.get("length", 0))
    elif rule.kind == "outbox_age":
        vals["outbox"] = float(obs.outbox.get("oldest_entry_age") or 0.0)
    elif rule.kind == "dead_letters":
        if base is None:
            return {}
        vals["deadletter"] = float(max(0, cur.dead - base.dead))
    elif rule.kind == "workers":
        vals["workers"] = float(len(obs.workers)) if obs.workers is not None else None
    elif rule.kind == "run_idle":
        vals = dict(obs.idle_runs)
    elif rule.kind == "run_resending":
        vals = {k: float(v) for k, v in obs.resending.items()}
    elif rule.kind == "fleet_shortage":  # only sites with work waiting are judged
        vals = {r["site"]: r["runs_at"] for r in obs.fleet if r["backlog"] > r["held"]}
    elif rule.kind == "sink_failing":
        vals = {name: 1.0 for name in obs.outbox.get("errors") or {}}
    elif rule.kind == "queue_unserved":
        vals = {q: float(n) for q, n in obs.unserved.items()}
    elif rule.kind == "module_broken":
        vals = {b["module"]: float(len(b["in"])) for b in obs.broken}
    return {k: v for k, v in vals.items() if fnmatch.fnmatchcase(k, rule.match)}


def causes(rule: Rule, obs: Observation) -> dict[str, str]:
    """Why a subject breaches, where a kind knows (a fleet shortage names its cause)."""
    if rule.kind == "fleet_shortage":
        return {r["site"]: describe_shortage(r) for r in obs.fleet if r["shortage"]}
    if rule.kind == "sink_failing":
        return {n: str(e.get("error", "")) for n, e in (obs.outbox.get("errors") or {}).items()}
    if rule.kind == "module_broken":
        return {b["module"]: f"{b['file']}:{b['line']}: {b['error']}" for b in obs.broken}
    return {}


def describe(
    rule: Rule, subject: str, value: float | None, recovered: bool = False, cause: str = ""
) -> str:
    """One readable line for the log and the webhook's `summary` (with its cause, if known)."""

    def fmt(v: float | None) -> str:
        if v is None:
            return "no data"
        if rule.kind in (*RATE_KINDS, "fleet_shortage"):
            return f"{v:.0%}"
        return f"{v:g}"

    limit = f"> {fmt(rule.above)}" if rule.above is not None else f"< {fmt(rule.below)}"
    what = {
        "failure_rate": f"failure rate of {subject} over {rule.window:g}s",
        "retry_rate": f"retry rate of {subject} over {rule.window:g}s",
        "pool_size": f"size of pool {subject}",
        "pool_bans": f"bans in pool {subject}",
        "queue_depth": f"depth of queue {subject}",
        "queue_growth": f"growth of queue {subject} over {rule.window:g}s",
        "outbox_backlog": "outbox backlog",
        "outbox_age": "age of the oldest unstored item (s)",
        "dead_letters": f"dead letters in {rule.window:g}s",
        "workers": "workers answering",
        "run_idle": f"time since run {subject} last finished a task (s)",
        "run_resending": f"tasks of run {subject} re-sent since it last finished one",
        "fleet_shortage": f"share of its entitlement site {subject} runs at",
        "sink_failing": f"failing writes of sink {subject}",
        "queue_unserved": f"messages in queue {subject} (no live worker consumes it)",
        "module_broken": f"processes that failed to import module {subject}",
    }.get(rule.kind, f"{subject} (rule no longer configured)")
    if recovered:
        return f"[{rule.name}] recovered: {what} is {fmt(value)} (limit {limit})"
    tail = f": {cause}" if cause else ""
    return f"[{rule.name}] {what} is {fmt(value)} ({limit}){tail}"


# --- the transition script -------------------------------------------------------------------------

_TRANSITION = load_lua(__file__, "alert_transition.lua")


# --- delivery --------------------------------------------------------------------------------------

Poster = Callable[[str, Mapping[str, Any], Mapping[str, str], float], None]


def post_json(
    url: str, payload: Mapping[str, Any], headers: Mapping[str, str], timeout: float
) -> None:
    resp = requests.post(
        url,
        json=payload,
        timeout=timeout,
        headers={"User-Agent": "chaincrawl-alerts", **headers},
    )
    if resp.status_code >= 300:
        raise RuntimeError(f"webhook answered HTTP {resp.status_code}")


def celery_ping(app: Celery, timeout: float = 1.0) -> list[str] | None:
    """Names of workers answering a broadcast ping; None when the broker is unreachable."""
    try:
        replies = app.control.ping(timeout=timeout) or []
    except Exception as exc:
        log.warning("worker ping failed: %s", exc)
        return None
    return sorted(name for r in replies for name in r)


def _host(url: str) -> str:
    u = urlsplit(url)
    return (
        f"{u.scheme}://{u.hostname}{':' + str(u.port) if u.port else ''}"  # no credentials, no path
    )


# --- the evaluator ---------------------------------------------------------------------------------


@dataclass
class Transition:
    rule: str
    subject: str
    action: str  # fire | resolve
    value: float | None
    summary: str


class Evaluator:
    """Evaluates every rule each tick; see the module docstring for the Redis state."""

    def __init__(
        self,
        client: Any,
        config: AlertConfig,
        settings: Settings | None = None,
        *,
        ping: Callable[[], list[str] | None] | None = None,
        post: Poster = post_json,
    ) -> None:
        self.r = client
        self.cfg = config
        self.s = settings or get_settings()
        self.k = Keys(self.s)
        self.ping = ping
        self.post = post
        self.token = uuid.uuid4().hex
        self._transition = client.register_script(_TRANSITION)

    # one evaluation ---------------------------------------------------------------------------
    def tick(self, now: float | None = None, force: bool = False) -> list[Transition] | None:
        """Sample, evaluate, notify. None when another monitor holds this interval's lock."""
        now = time.time() if now is None else now
        if not force and not self.r.set(
            self.k.lock, self.token, nx=True, px=max(1, int(self.cfg.interval * 900))
        ):
            return None
        obs = observe(self.r, self.s, now, self.ping)
        samples = self._record(obs.sample)
        transitions = self._evaluate(obs, samples, now)
        if obs.workers is not None:
            self.r.set(
                self.k.workers,
                orjson.dumps({"time": now, "workers": obs.workers}),
                px=max(1000, int(self.cfg.interval * 3000)),
            )
        self.deliver()
        return transitions

    def _record(self, sample: Sample) -> list[Sample]:
        keep = max(self.cfg.max_window * 1.5, 60.0) + 3 * self.cfg.interval
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(self.k.samples, {sample.encode(): sample.t})
        pipe.zremrangebyscore(self.k.samples, "-inf", sample.t - keep)
        pipe.zrangebyscore(self.k.samples, sample.t - keep, "+inf")
        return [Sample.decode(m) for m in pipe.execute()[2]]

    @staticmethod
    def base_sample(samples: list[Sample], now: float, window: float) -> Sample | None:
        """The newest sample at least `window` old, else the oldest (a partial window)."""
        older = [x for x in samples if x.t <= now - window + 1e-6]
        if older:
            return older[-1]
        first = samples[0] if samples else None
        return first if first is not None and first.t < now else None

    def values(
        self, obs: Observation | None = None, now: float | None = None
    ) -> dict[str, dict[str, float | None]]:
        """Every rule's current values, without touching alert state (`monitor check`)."""
        now = time.time() if now is None else now
        obs = obs or observe(self.r, self.s, now, self.ping)
        raw = self.r.zrangebyscore(self.k.samples, "-inf", "+inf")
        samples = [Sample.decode(m) for m in raw]
        return {
            rule.name: rule_values(rule, obs, self.base_sample(samples, now, rule.window))
            for rule in self.cfg.rules
        }

    def _evaluate(self, obs: Observation, samples: list[Sample], now: float) -> list[Transition]:
        out: list[Transition] = []
        seen: set[str] = set()
        open_states = {f.decode() for f in self.r.hkeys(self.k.state)}
        for rule in self.cfg.rules:
            base = self.base_sample(samples, now, rule.window)
            why = causes(rule, obs)
            for subject, value in sorted(rule_values(rule, obs, base).items()):
                field = f"{rule.name}|{subject}"
                seen.add(field)
                breached = rule.breached(value)
                if not breached and field not in open_states:
                    continue  # nothing open, nothing to open: skip the script call
                t = self._apply(rule, subject, value, breached, now, why.get(subject, ""))
                if t:
                    out.append(t)
        # states nobody measured this tick (subject gone, rule removed): treat as recovered
        by_name = {r.name: r for r in self.cfg.rules}
        for f in sorted(open_states - seen):
            rname, _, subject = f.partition("|")
            rule = by_name.get(rname) or Rule(name=rname, kind="removed", above=0.0)
            t = self._apply(rule, subject, None, False, now)
            if t:
                out.append(t)
        return out

    def _apply(
        self,
        rule: Rule,
        subject: str,
        value: float | None,
        breached: bool,
        now: float,
        cause: str = "",
    ) -> Transition | None:
        payload = {
            "source": "chaincrawl",
            "prefix": self.s.key_prefix,
            "rule": rule.name,
            "kind": rule.kind,
            "subject": subject,
            "severity": rule.severity,
            "threshold": rule.threshold,
            "window": rule.window,
            "for": rule.hold,
            "description": rule.description,
            "summary_firing": describe(rule, subject, value, cause=cause),
            "summary_resolved": describe(rule, subject, value, recovered=True),
        }
        action = self._transition(
            keys=[self.k.state, self.k.notify, self.k.history],
            args=[
                f"{rule.name}|{subject}",
                "1" if breached else "0",
                repr(now),
                repr(rule.hold),
                "" if value is None else repr(float(value)),
                uuid.uuid4().hex[:12],
                orjson.dumps(payload),
                HISTORY_MAX,
            ],
        )
        action = action.decode() if isinstance(action, bytes) else action
        if action == "fire":
            text = payload["summary_firing"]
            log.warning("ALERT FIRING %s", text)
        elif action == "resolve":
            text = payload["summary_resolved"]
            log.warning("ALERT RESOLVED %s", text)
        else:
            return None
        return Transition(rule.name, subject, action, value, str(text))

    # notifications --------------------------------------------------------------------------
    def deliver(self) -> int:
        """POST queued notifications in order; a failure stops this round and retries later."""
        sent = 0
        if not self.cfg.webhook:
            self.r.delete(self.k.notify)  # log-only configuration: the log line was the notice
            return 0
        while True:
            raw = self.r.lpop(self.k.notify)
            if raw is None:
                return sent
            note = orjson.loads(raw)
            attempts = int(note.pop("attempts", 0))
            try:
                self.post(self.cfg.webhook, note, self.cfg.headers, self.cfg.timeout)
                sent += 1
            except Exception as exc:
                attempts += 1
                if attempts >= self.cfg.max_attempts:
                    log.error(
                        "alert webhook %s failed %d times; dropping notice: %s (%s)",
                        _host(self.cfg.webhook),
                        attempts,
                        note.get("summary"),
                        exc,
                    )
                    continue
                log.warning(
                    "alert webhook %s failed (attempt %d): %s",
                    _host(self.cfg.webhook),
                    attempts,
                    exc,
                )
                self.r.lpush(self.k.notify, orjson.dumps({**note, "attempts": attempts}))
                return sent

    # the loop -----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        log.info(
            "alert evaluator: %d rule(s) from %s, every %gs, webhook %s",
            len(self.cfg.rules),
            self.cfg.source or "(none)",
            self.cfg.interval,
            _host(self.cfg.webhook) if self.cfg.webhook else "(log only)",
        )
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:
                log.exception("alert evaluation failed; retrying next interval")
            stop.wait(max(0.05, self.cfg.interval - (time.monotonic() - started)))


def evaluator_from_settings(
    s: Settings | None = None, config: AlertConfig | None = None, app: Celery | None = None
) -> Evaluator:
    """An evaluator on the settings' Redis; with `app`, the `workers` rule pings through it."""
    s = s or get_settings()
    ping = (lambda: celery_ping(app)) if app is not None else None
    return Evaluator(get_redis(s.redis_url), config or load_config(), s, ping=ping)


def rules_table(cfg: AlertConfig) -> Iterable[tuple[str, str, str, str, str]]:
    for r in cfg.rules:
        limit = f"> {r.above:g}" if r.above is not None else f"< {r.below:g}"
        windowed = r.kind in (*RATE_KINDS, "queue_growth", "dead_letters")
        yield r.name, r.kind, limit, f"{r.window:g}s" if windowed else "-", f"{r.hold:g}s"
