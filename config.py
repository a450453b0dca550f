"""Settings for every chaincrawl process, read from the environment (and an optional `.env`).

Every setting is an environment variable named `CHAINCRAWL_<FIELD>` (upper case); the
common infrastructure URLs also accept their conventional names (`REDIS_URL`, `BROKER_URL`,
`MONGO_URL`). One `Settings` object is built per process on first use; tests build their own
with `Settings(...)` or by setting variables before starting a worker process.

With no `REDIS_URL`, everything points at the embedded Redis that `control.sh` starts on
`EMBEDDED_REDIS_PORT`, so a fresh clone works with nothing installed but Python; its password
is generated into `var/redis.secret` (0600) on first use and every process reads it from
there (docs/security.md).

The other areas' settings live in the `settings` package, each a `ChaincrawlSettings` subclass
with a cached getter: `settings.storage` (outbox, sinks, routing), `settings.proxy` (the proxy
pool), `settings.browser` (rendered pages), `settings.monitor` (the exporter and alert rules),
`settings.suite` (variables only the test suite reads). `settings_classes()` lists them all;
per-site variables are in `settings.sitevars`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, model_validator

from exceptions import ConfigError
from settings.base import ROOT, ChaincrawlSettings, forget_all
from settings.browser import BrowserSettings
from settings.monitor import AlertSettings, MonitorSettings
from settings.proxy import ProxySettings
from settings.scheduling import FleetSettings, RecrawlSettings
from settings.sitevars import SITE_VARS, SiteVar, site_env
from settings.storage import StorageSettings
from settings.suite import SuiteSettings
from utils.secretfile import new_key, read_or_create, token

__all__ = [
    "DEFAULT_POOL",
    "EMBEDDED_REDIS_PORT",
    "POOLS",
    "ROOT",
    "SITE_VARS",
    "ChaincrawlSettings",
    "Settings",
    "SiteVar",
    "get_settings",
    "is_cluster_url",
    "is_redis_url",
    "reset_settings",
    "settings_classes",
    "site_env",
]

# The worker pool `control.sh start`, the demo and the tests use unless told otherwise. gevent:
# one OS thread per worker process (no GIL hand-offs between 16 threads on every lxml call and
# socket operation), a third less CPU per page than threads (docs/performance.md); the long
# torture suite passes on both (docs/reliability.md).
DEFAULT_POOL = "gevent"
POOLS = ("gevent", "threads", "prefork", "solo")
EMBEDDED_REDIS_PORT = 16379


def _env(name: str, *aliases: str) -> AliasChoices:
    return AliasChoices(f"CHAINCRAWL_{name}", *aliases)


class Settings(ChaincrawlSettings):
    """The core tunables: infrastructure, fetch layer, task mechanism, core storage, Flower."""

    # --- infrastructure -------------------------------------------------------------------
    redis_url: str = Field(
        "",
        validation_alias=_env("REDIS_URL", "REDIS_URL"),
        description="State store (counters, pools, dedup, outbox); may carry a password. "
        "`redis+cluster://host:port[,host:port...]` (`rediss+cluster://` with TLS): a Redis "
        "Cluster, which needs a BROKER_URL of its own (docs/cluster.md). "
        "Empty: the embedded Redis on EMBEDDED_REDIS_PORT that control.sh starts.",
    )
    embedded_redis_port: int = Field(EMBEDDED_REDIS_PORT, description="Port of the embedded Redis.")
    secret_key: str = Field(
        "",
        description="Keys that seal the secrets kept in Redis (session cookies, device ids, "
        "proxy credentials, vault tickets): 32 random bytes each, URL-safe base64 (`python -m "
        "utils.seal` makes one), comma-separated; the first seals, each opens, so a new key "
        "goes in front to rotate (docs/security.md). Every process sharing a Redis needs the "
        "same keys. Empty: the keys in SECRET_KEY_FILE.",
    )
    secret_key_file: str = Field(
        "",
        description="File holding the sealing keys (one a line) when SECRET_KEY is empty; "
        "made with a new key on first use, mode 0600. Empty: `var/secret.key`.",
    )
    broker_url: str = Field(
        "",
        validation_alias=_env("BROKER_URL", "BROKER_URL"),
        description="Celery broker; empty means the same Redis as REDIS_URL. amqp:// works too. "
        "Never a Redis Cluster (kombu's Redis transport needs one node).",
    )
    redis_wait_replicas: int = Field(
        0,
        ge=0,
        description="Replicas that must hold a task's change of state before its message is "
        "acknowledged (Redis WAIT): its commit (before its children are sent), the commit a "
        "redelivery finds already there, a park, a retry's counters. Not confirmed within "
        "REDIS_WAIT_TIMEOUT, the message is requeued quietly (one warning line an outage, "
        "chaincrawl_task_unreplicated_total). 0: no wait. With 1 on a cluster a master's "
        "failover loses no acknowledged commit (docs/cluster.md).",
    )
    redis_wait_timeout: float = Field(
        1.0, gt=0, description="Seconds a commit waits for REDIS_WAIT_REPLICAS replicas."
    )
    pool_parts: int = Field(
        3,
        ge=1,
        le=64,
        description="Sub-pools each resource pool of a site (cookies, devices, its proxy "
        "channel) is split into, each on a Redis Cluster slot of its own that falls on another "
        "master (the first is the pool's key layout before sub-pools): one site's leases "
        "spread over the cluster. A multiple of the cluster's masters; on one Redis only the "
        "key names change. Set it once: members of sub-pools a new value no longer names are "
        "not lent (docs/cluster.md).",
    )
    key_prefix: str = Field(
        "cc",
        description="Prefix of every Redis key we write (and of the broker's keys on Redis), "
        "so deployments and tests can share a server.",
    )
    var_dir: Path = Field(
        ROOT / "var",
        description="Runtime data: embedded Redis files, pid files, logs, JSONL items.",
        json_schema_extra={"shown_default": "var/"},
    )
    extra_site_packages: str = Field(
        "", description="Comma-separated packages of endpoint modules imported besides `sites`."
    )
    extra_chain_packages: str = Field(
        "",
        description="Comma-separated packages of chain modules imported besides `chains.defs`.",
    )
    log_level: str = Field(
        "INFO",
        description="Log level of the standalone drainer (`python -m external_interface.storage.outbox`).",
    )

    # --- fetch layer ----------------------------------------------------------------------
    connect_timeout: float = Field(5.0, description="Connect timeout per request.")
    request_timeout: float = Field(
        20.0,
        description="Whole-request deadline (connect + headers + body), enforced by our fetch layer.",
    )
    max_response_bytes: int = Field(
        10 * 1024 * 1024, description="Larger bodies fail with `ResponseTooLarge`."
    )
    max_redirects: int = Field(10, description="More fail with `TooManyRedirects`.")
    fetcher: str = Field(
        "pycurl",
        description="HTTP client of the fetch layer: pycurl (default: libcurl, the least CPU, "
        "HTTP/1.1), urllib3 (the same contract and errors in pure Python), requests (the same "
        "on requests) or impersonate (a browser's TLS, HTTP/2 and headers); "
        "an endpoint's `fetcher=` and `CHAINCRAWL_FETCHER_<SITE>` choose per endpoint and site.",
    )
    ca_bundle: str = Field(
        "",
        description="PEM file of the certificate authorities every fetcher trusts instead of "
        "certifi's (a private CA, a local site's); empty: certifi's.",
    )
    fetch_slots: int = Field(
        0,
        ge=0,
        description="Most requests one worker process has in flight (0: one per task slot). "
        "Give workers a few more task slots than this so the next request starts while "
        "finished ones parse and commit (`control.sh start -c 20 --fetch-slots 16`).",
    )

    providers: str = Field(
        "",
        description="Provider overrides: `kind=name` or `site.kind=name`, comma-separated "
        "(e.g. `cookie=noop,demo.user_agent=ua_static`).",
    )
    proxy_sites: str = Field(
        "", description="Sites whose requests go through the proxy pool (comma-separated)."
    )

    # --- task mechanism -------------------------------------------------------------------
    task_deadline: float = Field(
        120.0, description="Per-task deadline in seconds, held by the fetch layer on every pool."
    )
    max_retries: int = Field(4, description="Retries per task (an endpoint may set its own).")
    retry_backoff: float = Field(
        1.0, description="First retry backoff step; doubles per retry, with jitter."
    )
    retry_backoff_max: float = Field(
        120.0,
        description="Cap on one retry countdown; kept below the broker visibility timeout.",
    )
    max_redeliveries: int = Field(
        3,
        description="Deliveries of one attempt (worker lost each time) before it is dead-lettered.",
    )
    visibility_timeout: int = Field(
        3600,
        description="Redis broker: seconds before an unacknowledged message is redelivered.",
    )
    default_priority: int = Field(5, description="Run priority, 0..9, 9 = most urgent.")
    limits: str = Field(
        "",
        description="Shared rate limits and concurrency caps, e.g. `demo=20/s,8`, or a YAML/JSON "
        "file (docs/scheduling.md).",
    )
    gate: str = Field(
        "",
        description="Admission gate by name (`redis`, `noop`); empty: `redis` when LIMITS is "
        "set, else `noop` (scheduling/gate.py).",
    )
    gate_max_sleep: float = Field(
        1.0,
        description="Longest a request waits for its rate slot inside a task; longer waits re-queue.",
    )
    gate_retry: float = Field(
        0.5, description="Countdown for a task refused by a full concurrency cap."
    )
    run_max_in_flight: int = Field(
        2000,
        description="Backpressure: a run's tasks in the broker at once; more wait in Redis (0 = no cap).",
    )
    prefetch_multiplier: int = Field(
        1, description="Messages each worker slot reserves ahead; acks_late keeps them safe."
    )
    sweep_stall: float = Field(
        30.0,
        description="Redis broker: a run with no commit for this many seconds is checked for "
        "tasks the broker lost (a worker killed between pop and record), which are re-sent "
        "(chains/sweeper.py); 0 = off.",
    )
    dead_worker_after: float = Field(
        20.0,
        ge=0,
        description="Redis broker: a worker process whose heartbeat is this many seconds old "
        "counts as dead, and the messages it held unacknowledged are restored at the next "
        "sweep instead of after the visibility timeout, and every run's ledger is checked for "
        "a message it may have popped and lost (broker/owners.py); 0 = off.",
    )
    run_retention: int = Field(
        7 * 24 * 3600,
        ge=60,
        description="Seconds a run's record and counters are kept (`control.sh runs RID`). "
        "Once a run is complete and its items stored, its per-task bookkeeping (committed "
        "task ids, `unique` fingerprints) is dropped at once, leaving this summary "
        "(docs/performance.md, what a page leaves behind).",
    )
    sweep_interval: float = Field(
        5.0,
        description="Seconds between two sweeps of the run ledgers (one worker sweeps at a time); "
        "while the fleet is idle (no active run, nothing unacknowledged) the wait doubles up to "
        "60 s, and is back to this at the first pass that finds work or the first task the "
        "worker runs.",
    )
    pin_cores: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Pin worker n of a host to core n-1 (mod cores): `auto` for the threads "
        "pool only (its GIL hand-offs across cores cost it half its CPU per page), `on` for "
        "gevent and solo too, `off` never; prefork never (utils/affinity.py).",
    )
    task_events: bool = Field(
        False,
        description="Celery task events (Flower's task list, `-E`). Off by default: they cost "
        "~15% of a page's CPU and chaincrawl's own monitoring does not need them; "
        "`control.sh flower` switches them on in running workers.",
    )
    worker_start_attempts: int = Field(
        3,
        ge=1,
        description="`control.sh start`/`demo`: times a worker that dies before it is ready is "
        "started (back-off 1, 2, 4 s...) before the command fails with its last log lines.",
    )
    redis_wait: float = Field(
        120.0,
        ge=0,
        description="`control.sh` commands wait this long (s) for a Redis that is restarting "
        "or loading its data, or for a cluster's failover, then fail with one line naming "
        "the node (exit 5); nothing listening at REDIS_URL (a refused first connection) "
        "fails at once.",
    )
    task_log: bool = Field(
        False,
        description="Celery's per-task 'received'/'succeeded' INFO lines in worker logs "
        "(retries and failures are always logged).",
    )
    broker_max_connections: int = Field(
        0,
        description="Redis broker: connections kombu may open per worker; 0 = the worker's "
        "concurrency + 16, at least 64 (kombu's 10 starves gevent pools).",
    )
    batch: int = Field(
        20,
        description="Pages per Celery message while a run's backlog is deep (1 = one per message).",
    )
    batch_backlog: int = Field(
        0,
        description="A run's outstanding tasks from which children always go BATCH to a "
        "message. 0 (auto): up to outstanding / (2 x the worker's slots) per message, so the "
        "backlog still makes two messages per slot; under gevent one publish's children also "
        "go in at most 4 messages (a batch's pages run side by side there).",
    )
    resource_wait_max: float = Field(
        1800.0,
        description="Seconds a task may keep re-queueing for an empty resource pool (cookies, "
        "devices, proxies) before it is dead-lettered; shared rate limits wait without limit.",
    )
    metrics_flush_interval: float = Field(
        1.0,
        description="Seconds between writes of a worker's aggregated task metrics to Redis "
        "(run counters are exact regardless: they are in the commit).",
    )

    # --- politeness (docs/scheduling.md) and the development cache (docs/development.md) ---
    default_limits: str = Field(
        "4/s,8",
        description="Limits of each site without a CHAINCRAWL_LIMITS entry (unless that "
        "setting has a `*` entry): 4 requests/s and 8 tasks in flight; `off` for none.",
    )
    throttle: bool = Field(
        True,
        description="Adaptive per-site delay shared by every worker: aims at "
        "THROTTLE_TARGET_CONCURRENCY requests in flight from measured latency, backs off on "
        "429/503 and honours Retry-After (scheduling/throttle.py).",
    )
    throttle_target_concurrency: float = Field(
        1.0,
        gt=0,
        description="Requests a site should have in flight on average: delay = latency / this.",
    )
    throttle_start_delay: float = Field(
        1.0,
        ge=0,
        description="Seconds between requests to a site before any latency was measured.",
    )
    throttle_max_delay: float = Field(
        60.0,
        gt=0,
        description="The longest adaptive delay between two requests to one site.",
    )
    throttle_max_retry_after: float = Field(
        600.0,
        ge=0,
        description="Longest pause a site's Retry-After header imposes on its requests.",
    )
    robots: bool = Field(
        True,
        description="Honour each site's robots.txt (external_interface/fetch/robots.py); a "
        "disallowed URL is skipped, not failed.",
    )
    robots_ignore: str = Field(
        "",
        description="Sites (comma-separated) that opt out of robots.txt.",
    )
    robots_user_agent: str = Field(
        "chaincrawl",
        description="The product token matched against robots.txt `User-agent` groups: the "
        "default User-Agent's, `chaincrawl/VERSION (+URL)` (CHAINCRAWL_CONTACT_URL).",
    )
    robots_ttl: float = Field(
        86400.0,
        gt=0,
        description="Seconds a fetched robots.txt is kept in Redis for every worker.",
    )
    robots_error_ttl: float = Field(
        600.0,
        gt=0,
        description="Seconds a site whose robots.txt answered 5xx/429 counts as disallowed "
        "(its requests wait) before robots.txt is fetched again; the longest wait after "
        "fetches that got no answer.",
    )
    robots_unreachable_ttl: float = Field(
        5.0,
        gt=0,
        description="Seconds a site whose robots.txt got no answer (connection refused or "
        "reset, timeout) counts as disallowed (its requests wait) before robots.txt is "
        "fetched again; doubled with each such failure in a row, up to "
        "CHAINCRAWL_ROBOTS_ERROR_TTL.",
    )
    http_cache: str = Field(
        "",
        description="Development only: a directory where GET responses are stored and "
        "answered from on later runs, so iterating on a parser sends no requests. Empty: off.",
    )
    http_cache_ttl: float = Field(
        0.0,
        ge=0,
        description="Seconds a cached response stays valid (0: forever).",
    )
    http_cache_headers: str = Field(
        "accept,accept-language",
        description="Request headers (comma-separated) that are part of a cached response's key.",
    )

    # --- storage (the outbox and sinks have their own: settings/storage.py) -----------------
    mongo_url: str = Field(
        "",
        validation_alias=_env("MONGO_URL", "MONGO_URL"),
        description="MongoDB for the `mongo` sink.",
    )
    sinks: str = Field(
        "jsonl",
        description="Comma-separated sink names every item goes to (jsonl, mongo, http, kafka).",
    )
    outbox_batch: int = Field(500, description="Items per sink write.")
    outbox_flush_interval: float = Field(
        0.5, description="Seconds before a partial batch is flushed."
    )
    outbox_idle_flush: float = Field(
        0.05,
        ge=0,
        description="Seconds without new entries after which a partial batch is flushed "
        "(a run's last items are stored at once; 0: off).",
    )

    # --- flower ---------------------------------------------------------------------------
    flower_port: int = Field(5555, description="Flower's port.")
    flower_address: str = Field("127.0.0.1", description="Flower's listen address.")
    flower_user: str = Field("admin", description="Flower's basic-auth user.")
    flower_password: str = Field(
        "",
        description="Flower's basic-auth password; empty: generated into `var/flower.secret`.",
    )

    @model_validator(mode="after")
    def _derive(self) -> Settings:
        self.var_dir = Path(self.var_dir)
        if not self.redis_url:
            password = _private(self.var_dir / "redis.secret", "the embedded Redis's password")
            self.redis_url = f"redis://:{password}@127.0.0.1:{self.embedded_redis_port}/0"
        if is_cluster_url(self.broker_url):
            raise ConfigError(
                "CHAINCRAWL_BROKER_URL: a Redis Cluster cannot be the broker (kombu's Redis "
                "transport needs one node); use RabbitMQ (amqp://) or a standalone Redis"
            )
        if not self.broker_url:
            if is_cluster_url(self.redis_url):
                raise ConfigError(
                    "CHAINCRAWL_REDIS_URL is a Redis Cluster, which cannot be the broker: set "
                    "CHAINCRAWL_BROKER_URL to RabbitMQ (amqp://) or a standalone Redis"
                )
            self.broker_url = self.redis_url
        return self

    @property
    def sealing_key_file(self) -> Path:
        """Where the sealing key is kept when SECRET_KEY is empty."""
        return Path(self.secret_key_file) if self.secret_key_file else self.var_dir / "secret.key"

    def sealing_keys(self) -> list[str]:
        """The keys that seal and open secrets kept in Redis, the sealing one first: from
        SECRET_KEY, else from SECRET_KEY_FILE (a new key written there on first use)."""
        keys = [k.strip() for k in self.secret_key.split(",") if k.strip()]
        if keys:
            return keys
        text = _private(self.sealing_key_file, "the sealing key", new_key)
        return [k.strip() for k in text.replace("\n", ",").split(",") if k.strip()]

    def key(self, *parts: object) -> str:
        """Redis key under our prefix: `key("sweeper", "lock")` -> `cc:sweeper:lock` (a run's
        keys, with their hash tag: `utils.keyspace`)."""
        return ":".join((self.key_prefix, *(str(p) for p in parts)))

    @property
    def redis_broker(self) -> bool:
        return is_redis_url(self.broker_url)

    @property
    def broker_key_prefix(self) -> str:
        """kombu's `global_keyprefix` on a Redis broker (worker.py): its queues, `unacked` and
        the rest live under our prefix, so two deployments share a Redis. "" elsewhere."""
        return f"{self.key_prefix}:q:" if self.redis_broker else ""


def _private(path: Path, what: str, make: Callable[[], str] = token) -> str:
    """A secret kept in a 0600 file, made on first use; an error naming the file otherwise."""
    try:
        return read_or_create(path, make)
    except OSError as exc:
        raise ConfigError(f"cannot keep {what} in {path}: {exc.strerror}") from None
    except ValueError as exc:  # an empty file
        raise ConfigError(f"{what}: {exc}") from None


def is_redis_url(url: str) -> bool:
    """Whether a broker URL is kombu's Redis transport (TCP, TLS or a unix socket)."""
    return url.startswith(("redis", "rediss", "unix")) and not is_cluster_url(url)


def is_cluster_url(url: str) -> bool:
    """Whether a state-store URL names a Redis Cluster (`redis+cluster://`, `rediss+cluster://`)."""
    return url.startswith(("redis+cluster://", "rediss+cluster://"))


def get_settings() -> Settings:
    """This process's core settings, read on first use."""
    return Settings.current()


def reset_settings() -> None:
    """Forget every cached settings object, core and per area (tests that change the
    environment call this)."""
    forget_all()


def settings_classes() -> tuple[type[ChaincrawlSettings], ...]:
    """Every settings class, in the order the configuration reference lists them."""
    return (
        Settings,
        StorageSettings,
        ProxySettings,
        BrowserSettings,
        MonitorSettings,
        AlertSettings,
        RecrawlSettings,
        FleetSettings,
        SuiteSettings,
    )
