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

The rules and their syntax live in `monitor/alert_rules.py`, what they measure in
`monitor/alert_observations.py`, the webhook in `monitor/alert_webhook.py`; this module
holds the evaluator and re-exports their names.

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

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from celery import Celery

from config import Settings, get_settings
from monitor.alert_observations import (
    TASK_FIELDS,
    Observation,
    Sample,
    causes,
    celery_ping,
    describe,
    observe,
    rule_values,
)
from monitor.alert_rules import (
    KINDS,
    RATE_KINDS,
    AlertConfig,
    Rule,
    duration,
    load_config,
    parse_config,
    rules_table,
)
from monitor.alert_webhook import Poster, deliver, post_json, webhook_host
from utils.keyspace import Keyspace
from utils.lua import load_lua
from utils.redis import get_redis

__all__ = [  # the rules, observations and webhook live beside; importers reach them here too
    "HISTORY_MAX",
    "KINDS",
    "RATE_KINDS",
    "TASK_FIELDS",
    "AlertConfig",
    "Evaluator",
    "Keys",
    "Observation",
    "Poster",
    "Rule",
    "Sample",
    "Transition",
    "causes",
    "celery_ping",
    "describe",
    "duration",
    "evaluator_from_settings",
    "firing",
    "history",
    "load_config",
    "observe",
    "parse_config",
    "post_json",
    "rule_values",
    "rules_table",
    "workers_seen",
]

log = logging.getLogger("chaincrawl.alerts")

HISTORY_MAX = 1000


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


# --- the transition script -------------------------------------------------------------------------

_TRANSITION = load_lua(__file__, "alert_transition.lua")


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
        return deliver(self.r, self.k.notify, self.cfg, self.post)

    # the loop -----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        log.info(
            "alert evaluator: %d rule(s) from %s, every %gs, webhook %s",
            len(self.cfg.rules),
            self.cfg.source or "(none)",
            self.cfg.interval,
            webhook_host(self.cfg.webhook) if self.cfg.webhook else "(log only)",
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
