"""Prometheus exporter: `/metrics` in the text format, read from Redis on every scrape.

A custom collector turns the counters every worker already keeps in Redis (monitor.metrics,
run counters, pools, outbox, dead letters, alert state) into metric families, so the numbers
are cluster-wide, survive worker restarts, and any number of exporters agree. Metric names
and labels are listed in docs/monitoring.md; they are a stable interface.

Auth: bound to a loopback address, `/metrics` is open unless a password is configured; bound
to anything else, HTTP basic auth is required, with `CHAINCRAWL_MONITOR_PASSWORD` or a password
generated once into `var/monitor.secret` (0600). `/healthz` is always open and says nothing.
"""

from __future__ import annotations

import base64
import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import redis
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from config import Settings, get_settings
from ledger.state import COUNTERS
from monitor import alerts, health
from monitor import status as st
from settings.monitor import MonitorSettings, get_monitor_settings
from utils.keyspace import Keyspace
from utils.redis import get_redis
from utils.secretfile import read_or_create
from utils.servers import is_loopback
from utils.slots import SlotsLost, lost_for, lost_ranges

log = logging.getLogger("chaincrawl.exporter")

TASK_LABELS = ["site", "task"]
RUN_COUNTERS = COUNTERS  # a run's counters (ledger/records.py), each a gauge


class ChaincrawlCollector(Collector):
    """Reads Redis at each `collect()`; never raises (a dead Redis shows as chaincrawl_up 0)."""

    def __init__(
        self, client: Any = None, settings: Settings | None = None, runs_limit: int = 50
    ) -> None:
        self.s = settings or get_settings()
        self._client = client
        self.runs_limit = runs_limit

    @property
    def r(self) -> Any:
        if self._client is None:
            self._client = get_redis(self.s.redis_url)
        return self._client

    def describe(self) -> list[Metric]:
        return []  # registering must not scrape Redis

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        families: list[Metric] = []
        up = 1
        parts: tuple[Callable[[], list[Metric]], ...] = (
            self._tasks,
            self._queues,
            self._storage,
            self._pools,
            self._runs,
            self._alerts,
            self._cluster,
        )
        try:
            self.r.ping()
        except Exception as exc:  # Redis down: say so at once instead of failing every part
            log.warning("scrape: Redis unreachable: %s", exc)
            up, parts = 0, ()
        for part in parts:
            try:
                families.extend(part())
            except Exception as exc:  # one unreadable part must not hide the others
                up = 0
                log.warning("scrape: %s failed: %s", part.__name__, exc)
        yield from families
        yield GaugeMetricFamily(
            "chaincrawl_up", "1 if every part of the last scrape read Redis", value=up
        )
        yield GaugeMetricFamily(
            "chaincrawl_scrape_duration_seconds",
            "Time this scrape took",
            value=time.perf_counter() - t0,
        )

    # -- per task (and so per site: the site label) ----------------------------------------------
    def _tasks(self) -> list[Metric]:
        tasks = CounterMetricFamily(
            "chaincrawl_tasks", "Task attempts by outcome", labels=[*TASK_LABELS, "outcome"]
        )
        retries = CounterMetricFamily(
            "chaincrawl_retries", "Retries by error type", labels=[*TASK_LABELS, "reason"]
        )
        failures = CounterMetricFamily(
            "chaincrawl_failures",
            "Tasks failed for good by error type",
            labels=[*TASK_LABELS, "reason"],
        )
        waits = CounterMetricFamily(
            "chaincrawl_waits",
            "Tasks put back to wait (rate limits, pools)",
            labels=[*TASK_LABELS, "reason"],
        )
        requests = CounterMetricFamily(
            "chaincrawl_http_requests", "HTTP requests made, answered or not", labels=TASK_LABELS
        )
        responses = CounterMetricFamily(
            "chaincrawl_http_responses", "HTTP responses by status", labels=[*TASK_LABELS, "status"]
        )
        nbytes = CounterMetricFamily(
            "chaincrawl_response_bytes", "Response body bytes downloaded", labels=TASK_LABELS
        )
        items = CounterMetricFamily(
            "chaincrawl_items", "Items produced and validated by tasks", labels=TASK_LABELS
        )
        stored = CounterMetricFamily(
            "chaincrawl_items_stored", "Items durably stored by the outbox", labels=TASK_LABELS
        )
        store_failed = CounterMetricFamily(
            "chaincrawl_items_store_failed", "Items refused by a sink", labels=TASK_LABELS
        )
        skips = CounterMetricFamily(
            "chaincrawl_skips",
            "Requests never sent, by reason (robots, seen)",
            labels=[*TASK_LABELS, "reason"],
        )
        undecodable = CounterMetricFamily(
            "chaincrawl_undecodable_responses",
            "Responses whose text had bytes their charset cannot decode (U+FFFD stored)",
            labels=TASK_LABELS,
        )
        empty = CounterMetricFamily(
            "chaincrawl_empty_pages",
            "Pages that yielded nothing (no item, no follow-up): a selector matching nothing?",
            labels=TASK_LABELS,
        )
        redelivered = CounterMetricFamily(
            "chaincrawl_task_redelivered",
            "Attempts delivered again after their worker died or lost its broker connection",
            labels=TASK_LABELS,
        )
        unreplicated = CounterMetricFamily(
            "chaincrawl_task_unreplicated",
            "Messages requeued because too few replicas confirmed their state change "
            "(CHAINCRAWL_REDIS_WAIT_REPLICAS)",
            labels=TASK_LABELS,
        )
        undecodable_bytes = CounterMetricFamily(
            "chaincrawl_undecodable_bytes",
            "Bytes replaced with U+FFFD in response text",
            labels=TASK_LABELS,
        )
        latency = HistogramMetricFamily(
            "chaincrawl_task_latency_seconds", "Task run time", labels=TASK_LABELS
        )
        hook_labels = [*TASK_LABELS, "point", "hook"]
        hook_calls = CounterMetricFamily(
            "chaincrawl_hook_calls", "Calls of a lifecycle hook (docs/hooks.md)", labels=hook_labels
        )
        hook_time = CounterMetricFamily(
            "chaincrawl_hook_seconds", "Time spent in a lifecycle hook", labels=hook_labels
        )
        hook_signals = CounterMetricFamily(
            "chaincrawl_hook_signals",
            "What a lifecycle hook answered (continue, skip, retry, "
            "fail) or that it raised (error)",
            labels=[*hook_labels, "signal"],
        )
        for task, m in st.task_metrics(self.r, self.s).items():
            lab = [st.site_of(task), task]
            for o in st.OUTCOMES:
                tasks.add_metric([*lab, o], m.get(o, 0))
            for fam, prefix in ((retries, "retried"), (failures, "failed"), (waits, "waited")):
                for reason, n in st.breakdown(m, prefix).items():
                    fam.add_metric([*lab, reason], n)
            requests.add_metric(lab, m.get("requests", 0))
            for status, n in st.breakdown(m, "http").items():
                responses.add_metric([*lab, status], n)
            nbytes.add_metric(lab, m.get("bytes", 0))
            items.add_metric(lab, m.get("items", 0))
            if "stored" in m:
                stored.add_metric(lab, m["stored"])
            if "store_failed" in m:
                store_failed.add_metric(lab, m["store_failed"])
            summ = st.summary(m)
            for reason, n in summ["skips"].items():
                if n:
                    skips.add_metric([*lab, reason], n)
            if summ["empty"]:
                empty.add_metric(lab, summ["empty"])
            if m.get("redelivered"):
                redelivered.add_metric(lab, m["redelivered"])
            if m.get("unreplicated"):
                unreplicated.add_metric(lab, m["unreplicated"])
            if summ["undecodable"]:
                undecodable.add_metric(lab, summ["undecodable"])
                undecodable_bytes.add_metric(lab, summ["undecodable_bytes"])
            buckets = [(floatToGoString(b), n) for b, n in st.latency_buckets(m)]
            latency.add_metric(lab, buckets, sum_value=m.get("latency_ms_sum", 0) / 1000.0)
            for (point, hook), counts in st.hook_counts(m).items():
                hl = [*lab, point, hook]
                hook_calls.add_metric(hl, counts.pop("calls", 0))
                hook_time.add_metric(hl, counts.pop("us", 0) / 1e6)
                for signal, n in counts.items():
                    hook_signals.add_metric([*hl, signal], n)
        return [
            tasks,
            retries,
            failures,
            waits,
            requests,
            responses,
            nbytes,
            items,
            stored,
            store_failed,
            skips,
            undecodable,
            undecodable_bytes,
            empty,
            redelivered,
            unreplicated,
            latency,
            hook_calls,
            hook_time,
            hook_signals,
        ]

    # -- broker -------------------------------------------------------------------------------------
    def _queues(self) -> list[Metric]:
        broker = st.broker_client(self.r, self.s)
        depth = GaugeMetricFamily(
            "chaincrawl_queue_depth", "Messages waiting in a queue", labels=["queue"]
        )
        for q, n in st.queue_depths(broker, self.s).items():
            depth.add_metric([q], n)
        out: list[Metric] = [depth]
        if self.s.redis_broker:
            out.append(
                GaugeMetricFamily(
                    "chaincrawl_queue_unacked",
                    "Messages delivered to workers, not yet acknowledged",
                    value=st.unacked(broker, self.s),
                )
            )
        seen = alerts.workers_seen(self.r, self.s)
        if seen is not None:
            out.append(
                GaugeMetricFamily(
                    "chaincrawl_workers",
                    "Workers that answered the monitor's last ping",
                    value=len(seen.get("workers") or ()),
                )
            )
        return out

    # -- dead letters and the outbox -----------------------------------------------------------------
    def _storage(self) -> list[Metric]:
        out: list[Metric] = [
            GaugeMetricFamily(
                "chaincrawl_dead_letters",
                "Tasks in the dead-letter store",
                value=st.dead_letters(self.r, self.s),
            ),
        ]
        out.append(
            GaugeMetricFamily(
                "chaincrawl_broker_malformed",
                "Undecodable broker messages skipped by workers",
                value=st.malformed(self.r, self.s),
            )
        )
        out.append(
            GaugeMetricFamily(
                "chaincrawl_broker_dead_worker_restored",
                "Unacknowledged messages given back because the worker holding them died",
                value=st.dead_worker_restored(self.r, self.s),
            )
        )
        out.append(
            GaugeMetricFamily(
                "chaincrawl_tasks_unknown",
                "Messages workers failed and dead-lettered because they do not know the task",
                value=st.unknown_tasks(self.r, self.s),
            )
        )
        b = st.outbox(self.r, self.s)
        out.append(
            GaugeMetricFamily(
                "chaincrawl_outbox_backlog",
                "Outbox entries not yet stored",
                value=b.get("length", 0),
            )
        )
        if "pending" in b:
            out.append(
                GaugeMetricFamily(
                    "chaincrawl_outbox_pending",
                    "Outbox entries read by a drainer, not yet confirmed",
                    value=b["pending"],
                )
            )
        out.append(
            GaugeMetricFamily(
                "chaincrawl_outbox_oldest_age_seconds",
                "Age of the oldest entry waiting for storage",
                value=b.get("oldest_entry_age") or 0,
            )
        )
        if "dead" in b:
            out.append(
                GaugeMetricFamily(
                    "chaincrawl_outbox_dead", "Outbox entries a sink refused", value=b["dead"]
                )
            )
        if "errors" in b:
            out.append(
                GaugeMetricFamily(
                    "chaincrawl_outbox_sink_errors",
                    "Sinks failing right now",
                    value=len(b["errors"] or {}),
                )
            )
        return out

    # -- resource pools ----------------------------------------------------------------------------------
    def _pools(self) -> list[Metric]:
        labels = ["pool", "kind", "site"]
        size = GaugeMetricFamily("chaincrawl_pool_size", "Pool members usable now", labels=labels)
        bans = GaugeMetricFamily(
            "chaincrawl_pool_banned", "Pool members banned or cooling down", labels=labels
        )
        produced = CounterMetricFamily(
            "chaincrawl_pool_produced", "Pool members ever added", labels=labels
        )
        age = GaugeMetricFamily(
            "chaincrawl_pool_report_age_seconds", "Age of a pushed pool report", labels=labels
        )
        for h in health.collect(self.r, self.s):
            lab = [h.name, h.kind, h.site]
            size.add_metric(lab, h.size)
            bans.add_metric(lab, h.bans)
            produced.add_metric(lab, h.produced)
            if h.source == "report":
                age.add_metric(lab, h.age)
        return [size, bans, produced, age]

    # -- runs -------------------------------------------------------------------------------------------
    def _runs(self) -> list[Metric]:
        recs = st.run_records(self.r, self.s, limit=self.runs_limit)
        active = GaugeMetricFamily(
            "chaincrawl_active_runs",
            "Chain runs not yet done",
            value=int(self.r.scard(Keyspace(self.s.key_prefix).active_runs)),
        )
        steps = GaugeMetricFamily(
            "chaincrawl_run_tasks",
            "Per-step counters of an active run",
            labels=["run", "chain", "step", "counter"],
        )
        outstanding = GaugeMetricFamily(
            "chaincrawl_run_outstanding", "Tasks of a run not finished", labels=["run", "chain"]
        )
        age = GaugeMetricFamily(
            "chaincrawl_run_age_seconds", "Seconds since a run started", labels=["run", "chain"]
        )
        paused = GaugeMetricFamily(
            "chaincrawl_run_paused", "1 while a run is paused", labels=["run", "chain"]
        )
        storing = GaugeMetricFamily(
            "chaincrawl_run_storing",
            "1 while a run's tasks are done and its items still wait in the outbox",
            labels=["run", "chain"],
        )
        resending = GaugeMetricFamily(
            "chaincrawl_run_resends_stalled",
            "Tasks of a run the sweeper re-sent since the run's last commit",
            labels=["run", "chain"],
        )
        for rec in recs:
            rid, chain = rec["run_id"], rec["chain"]
            outstanding.add_metric([rid, chain], rec["outstanding"])
            resending.add_metric([rid, chain], rec["resending"])
            paused.add_metric([rid, chain], int(rec["status"] == "paused"))
            storing.add_metric([rid, chain], int(rec["status"] == "storing"))
            if rec["age"] is not None:
                age.add_metric([rid, chain], rec["age"])
            for step, counters in sorted(rec["steps"].items()):
                for c in RUN_COUNTERS:
                    if c in counters:
                        steps.add_metric([rid, chain, step, c], counters[c])
        return [active, steps, outstanding, age, paused, storing, resending]

    # -- alerts -----------------------------------------------------------------------------------------
    def _alerts(self) -> list[Metric]:
        fam = GaugeMetricFamily(
            "chaincrawl_alerts_firing", "Alert incidents open now", labels=["rule", "subject"]
        )
        for a in alerts.firing(self.r, self.s):
            fam.add_metric([a["rule"], a["subject"]], 1)
        return [fam]

    # -- a Redis Cluster's lost slot ranges (docs/cluster.md) ------------------------------------------
    def _cluster(self) -> list[Metric]:
        """The lost slot ranges and the runs paused on them, and the workers' counts of the
        outages and of the messages they parked. Each read that a lost range holds (the run
        list, the `metrics:cluster` hash: keys without a hash tag) is left out, not failed."""
        ranges = lost_ranges(self.r)
        ks = Keyspace(self.s.key_prefix)
        slots = GaugeMetricFamily(
            "chaincrawl_slots_lost",
            "Hash slots of the Redis Cluster no node serves (a master and its replicas down)",
            value=sum(r.end - r.start + 1 for r in ranges),
        )
        per_range = GaugeMetricFamily(
            "chaincrawl_slot_range_lost",
            "Runs paused on a lost slot range (NaN: the run list is on a lost range too)",
            labels=["slots", "master"],
        )
        out: list[Metric] = [slots, per_range]
        unread = (SlotsLost, redis.RedisError, redis.exceptions.RedisClusterException)
        if ranges:
            try:
                rids: list[str] | None = [
                    m.decode() if isinstance(m, bytes) else str(m)
                    for m in self.r.smembers(ks.active_runs)
                ]
            except unread:
                rids = None
            held = [lost_for(ranges, ks.run(rid)) for rid in rids or ()]
            for r in ranges:
                n = float("nan") if rids is None else float(sum(h == r for h in held))
                per_range.add_metric([r.slots, r.master], n)
        try:
            counts = self.r.hgetall(self.s.key("metrics", "cluster"))
        except unread:
            if not ranges:
                raise
            return out  # the hash is on the lost range: its counts show once it returns
        got = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in counts.items()}
        for name, field, doc in (
            ("chaincrawl_lost_slot_outages", "lost_slots",
             "Lost slot range outages the workers met (one a worker process an outage)"),
            ("chaincrawl_messages_parked_lost", "parked_lost",
             "Messages parked because their state lives on a lost slot range"),
        ):  # fmt: skip
            out.append(CounterMetricFamily(name, doc, value=got.get(field, 0)))
        return out


def make_registry(
    client: Any = None, settings: Settings | None = None, runs_limit: int = 50
) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ChaincrawlCollector(client, settings, runs_limit))
    return reg


# --- HTTP ------------------------------------------------------------------------------------------


def monitor_password(s: Settings, ms: MonitorSettings) -> tuple[str, str]:
    """(password, where it comes from): configured, else generated once into var/monitor.secret."""
    if ms.password:
        return ms.password, "CHAINCRAWL_MONITOR_PASSWORD"
    f = s.var_dir / "monitor.secret"
    return read_or_create(f), str(f)


def auth_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class MetricsHandler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    expected_auth: str | None = None  # None: open
    server_version = "chaincrawl-exporter"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/healthz":
            return self._send(200, b"ok\n", "text/plain; charset=utf-8")
        if self.expected_auth is not None and not hmac.compare_digest(
            (self.headers.get("Authorization") or "").encode(), self.expected_auth.encode()
        ):
            return self._send(
                401,
                b"authentication required\n",
                "text/plain; charset=utf-8",
                {"WWW-Authenticate": 'Basic realm="chaincrawl metrics", charset="UTF-8"'},
            )
        if path == "/":
            return self._send(200, b'<a href="/metrics">/metrics</a>\n', "text/html; charset=utf-8")
        if path != "/metrics":
            return self._send(404, b"not found\n", "text/plain; charset=utf-8")
        encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
        try:
            body = encoder(self.registry)
        except Exception as exc:  # the collector catches Redis errors; this is a bug guard
            log.exception("scrape failed")
            return self._send(500, f"scrape failed: {type(exc).__name__}\n".encode(), "text/plain")
        return self._send(200, body, content_type)

    def _send(
        self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class ExporterServer:
    """The HTTP server in a daemon thread; `close()` stops it."""

    def __init__(
        self, address: str, port: int, registry: CollectorRegistry, auth: str | None
    ) -> None:
        handler = type("Handler", (MetricsHandler,), {"registry": registry, "expected_auth": auth})
        self.httpd = ThreadingHTTPServer((address, port), handler)
        self.httpd.daemon_threads = True
        self.address, self.port = address, self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="exporter", daemon=True
        )

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> ExporterServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(
    s: Settings | None = None,
    ms: MonitorSettings | None = None,
    *,
    address: str | None = None,
    port: int | None = None,
    client: Any = None,
) -> tuple[ExporterServer, str]:
    """Start the exporter; returns it and a line describing the auth in force."""
    s = s or get_settings()
    ms = ms or get_monitor_settings()
    address = address or ms.address
    port = ms.port if port is None else port
    auth: str | None = None
    note = "no auth (loopback only)"
    if ms.password or not is_loopback(address):
        password, where = monitor_password(s, ms)
        auth = auth_header(ms.user, password)
        note = f"basic auth: user {ms.user!r}, password in {where}"
    server = ExporterServer(address, port, make_registry(client, s, ms.runs_limit), auth).start()
    return server, note
