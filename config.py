"""Settings for every chaincrawl process, read from the environment (and an optional `.env`).

Every setting is an environment variable named `CHAINCRAWL_<FIELD>` (upper case); the
common infrastructure URLs also accept their conventional names (`REDIS_URL`, `BROKER_URL`,
`MONGO_URL`). One `Settings` object is built per process on first use; tests build their own
with `Settings(...)` or by setting variables before starting a worker process.

With no `REDIS_URL`, everything points at the embedded Redis that `control.sh` starts on
`EMBEDDED_REDIS_PORT`, so a fresh clone works with nothing installed but Python.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ROOT = Path(__file__).resolve().parent
# The worker pool `control.sh start`, the demo and the tests use unless told otherwise. gevent:
# one OS thread per worker process (no GIL hand-offs between 16 threads on every lxml call and
# socket operation), a third less CPU per page than threads (docs/performance.md); the long
# torture suite passes on both (docs/reliability.md, bugs 10 and 11).
DEFAULT_POOL = "gevent"
POOLS = ("gevent", "threads", "prefork", "solo")
EMBEDDED_REDIS_PORT = 16379


def _env(name: str, *aliases: str) -> AliasChoices:
    return AliasChoices(f"CHAINCRAWL_{name}", *aliases)


class Settings(BaseSettings):
    """All tunables with their defaults; the README's configuration table mirrors this class."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    # --- infrastructure -------------------------------------------------------------------
    redis_url: str = Field(
        "",
        validation_alias=_env("REDIS_URL", "REDIS_URL"),
        description="State store (counters, pools, dedup, outbox); may carry a password. "
        "Empty: the embedded Redis on EMBEDDED_REDIS_PORT that control.sh starts.",
    )
    embedded_redis_port: int = Field(
        EMBEDDED_REDIS_PORT, validation_alias=_env("EMBEDDED_REDIS_PORT")
    )
    broker_url: str = Field(
        "",
        validation_alias=_env("BROKER_URL", "BROKER_URL"),
        description="Celery broker; empty means the same Redis as REDIS_URL. amqp:// works too.",
    )
    key_prefix: str = Field(
        "cc",
        validation_alias=_env("KEY_PREFIX"),
        description="Prefix of every Redis key we write, so deployments and tests can share a server.",
    )
    var_dir: Path = Field(
        ROOT / "var",
        validation_alias=_env("VAR_DIR"),
        description="Runtime data: embedded Redis files, pid files, logs, JSONL items.",
    )
    extra_site_packages: str = Field(
        "",
        validation_alias=_env("EXTRA_SITE_PACKAGES"),
        description="Comma-separated packages of endpoint modules imported besides `sites`.",
    )
    extra_chain_packages: str = Field(
        "",
        validation_alias=_env("EXTRA_CHAIN_PACKAGES"),
        description="Comma-separated packages of chain modules imported besides `chains.defs`.",
    )

    # --- fetch layer ----------------------------------------------------------------------
    connect_timeout: float = Field(5.0, validation_alias=_env("CONNECT_TIMEOUT"))
    request_timeout: float = Field(
        20.0,
        validation_alias=_env("REQUEST_TIMEOUT"),
        description="Whole-request deadline (connect + headers + body), enforced by our fetch layer.",
    )
    max_response_bytes: int = Field(10 * 1024 * 1024, validation_alias=_env("MAX_RESPONSE_BYTES"))
    max_redirects: int = Field(10, validation_alias=_env("MAX_REDIRECTS"))
    fetcher: str = Field(
        "urllib3",
        validation_alias=_env("FETCHER"),
        description="HTTP client of the fetch layer: urllib3 (default, leaner) or requests.",
    )
    fetch_slots: int = Field(
        0,
        ge=0,
        validation_alias=_env("FETCH_SLOTS"),
        description="Most requests one worker process has in flight (0: one per task slot). "
        "Give workers a few more task slots than this so the next request starts while "
        "finished ones parse and commit (`control.sh start -c 20 --fetch-slots 16`).",
    )

    providers: str = Field(
        "",
        validation_alias=_env("PROVIDERS"),
        description="Provider overrides: `kind=name` or `site.kind=name`, comma-separated "
        "(e.g. `cookie=noop,demo.user_agent=ua_static`).",
    )
    proxy_sites: str = Field(
        "",
        validation_alias=_env("PROXY_SITES"),
        description="Sites whose requests go through the proxy pool (comma-separated).",
    )

    # --- task mechanism -------------------------------------------------------------------
    task_deadline: float = Field(
        120.0,
        validation_alias=_env("TASK_DEADLINE"),
        description="Per-task deadline in seconds, held by the fetch layer on every pool.",
    )
    max_retries: int = Field(4, validation_alias=_env("MAX_RETRIES"))
    retry_backoff: float = Field(1.0, validation_alias=_env("RETRY_BACKOFF"))
    retry_backoff_max: float = Field(
        120.0,
        validation_alias=_env("RETRY_BACKOFF_MAX"),
        description="Cap on one retry countdown; kept below the broker visibility timeout.",
    )
    max_redeliveries: int = Field(
        3,
        validation_alias=_env("MAX_REDELIVERIES"),
        description="Deliveries of one attempt (worker lost each time) before it is dead-lettered.",
    )
    visibility_timeout: int = Field(
        3600,
        validation_alias=_env("VISIBILITY_TIMEOUT"),
        description="Redis broker: seconds before an unacknowledged message is redelivered.",
    )
    default_priority: int = Field(
        5, validation_alias=_env("DEFAULT_PRIORITY"), description="0..9, 9 = most urgent."
    )
    limits: str = Field(
        "",
        validation_alias=_env("LIMITS"),
        description="Shared rate limits and concurrency caps, e.g. `demo=20/s,8` (docs/scheduling.md).",
    )
    gate_max_sleep: float = Field(
        1.0,
        validation_alias=_env("GATE_MAX_SLEEP"),
        description="Longest a request waits for its rate slot inside a task; longer waits re-queue.",
    )
    gate_retry: float = Field(
        0.5,
        validation_alias=_env("GATE_RETRY"),
        description="Countdown for a task refused by a full concurrency cap.",
    )
    run_max_in_flight: int = Field(
        2000,
        validation_alias=_env("RUN_MAX_IN_FLIGHT"),
        description="Backpressure: a run's tasks in the broker at once; more wait in Redis (0 = no cap).",
    )
    prefetch_multiplier: int = Field(
        1,
        validation_alias=_env("PREFETCH_MULTIPLIER"),
        description="Messages each worker slot reserves ahead; acks_late keeps them safe.",
    )
    sweep_stall: float = Field(
        30.0,
        validation_alias=_env("SWEEP_STALL"),
        description="Redis broker: a run with no commit for this many seconds is checked for "
        "tasks the broker lost (bug 1), which are re-sent (chains/sweeper.py); 0 = off.",
    )
    dead_worker_after: float = Field(
        20.0,
        ge=0,
        validation_alias=_env("DEAD_WORKER_AFTER"),
        description="Redis broker: a worker process whose heartbeat is this many seconds old "
        "counts as dead, and the messages it held unacknowledged are restored at the next "
        "sweep instead of after the visibility timeout, and every run's ledger is checked for "
        "a message it may have popped and lost (utils/unacked_owners.py); 0 = off.",
    )
    sweep_interval: float = Field(
        5.0,
        validation_alias=_env("SWEEP_INTERVAL"),
        description="Seconds between two sweeps of the run ledgers (one worker sweeps at a time).",
    )
    pin_cores: Literal["auto", "on", "off"] = Field(
        "auto",
        validation_alias=_env("PIN_CORES"),
        description="Pin worker n of a host to core n-1 (mod cores): `auto` for the threads "
        "pool only (its GIL hand-offs across cores cost it half its CPU per page), `on` for "
        "gevent and solo too, `off` never; prefork never (utils/affinity.py).",
    )
    task_events: bool = Field(
        False,
        validation_alias=_env("TASK_EVENTS"),
        description="Celery task events (Flower's task list, `-E`). Off by default: they cost "
        "~15% of a page's CPU and chaincrawl's own monitoring does not need them.",
    )
    task_log: bool = Field(
        False,
        validation_alias=_env("TASK_LOG"),
        description="Celery's per-task 'received'/'succeeded' INFO lines in worker logs.",
    )
    broker_max_connections: int = Field(
        0,
        validation_alias=_env("BROKER_MAX_CONNECTIONS"),
        description="Redis broker: connections kombu may open per worker; 0 = the worker's "
        "concurrency + 16, at least 64 (kombu's 10 starves gevent pools).",
    )
    batch: int = Field(
        20,
        validation_alias=_env("BATCH"),
        description="Pages per Celery message while a run's backlog is deep (1 = one per message).",
    )
    batch_backlog: int = Field(
        0,
        validation_alias=_env("BATCH_BACKLOG"),
        description="A run's outstanding tasks from which children always go BATCH to a "
        "message. 0 (auto): up to outstanding / (2 x the worker's slots) per message, so the "
        "backlog still makes two messages per slot; under gevent one publish's children also "
        "go in at most 4 messages (a batch's pages run side by side there).",
    )
    resource_wait_max: float = Field(
        1800.0,
        validation_alias=_env("RESOURCE_WAIT_MAX"),
        description="Seconds a task may keep re-queueing for an empty resource pool (cookies, "
        "devices, proxies) before it is dead-lettered; shared rate limits wait without limit.",
    )
    metrics_flush_interval: float = Field(
        1.0,
        validation_alias=_env("METRICS_FLUSH_INTERVAL"),
        description="Seconds between writes of a worker's aggregated task metrics to Redis.",
    )

    # --- storage --------------------------------------------------------------------------
    mongo_url: str = Field("", validation_alias=_env("MONGO_URL", "MONGO_URL"))
    sinks: str = Field(
        "jsonl",
        validation_alias=_env("SINKS"),
        description="Comma-separated sink names every item goes to (jsonl, mongo, http, kafka).",
    )
    outbox_batch: int = Field(500, validation_alias=_env("OUTBOX_BATCH"))
    outbox_flush_interval: float = Field(0.5, validation_alias=_env("OUTBOX_FLUSH_INTERVAL"))
    outbox_idle_flush: float = Field(
        0.05,
        ge=0,
        validation_alias=_env("OUTBOX_IDLE_FLUSH"),
        description="Seconds without new entries after which a partial batch is flushed (0: off).",
    )

    # --- flower ---------------------------------------------------------------------------
    flower_port: int = Field(5555, validation_alias=_env("FLOWER_PORT"))
    flower_address: str = Field("127.0.0.1", validation_alias=_env("FLOWER_ADDRESS"))
    flower_user: str = Field("admin", validation_alias=_env("FLOWER_USER"))
    flower_password: str = Field("", validation_alias=_env("FLOWER_PASSWORD"))

    @model_validator(mode="after")
    def _derive(self) -> Settings:
        if not self.redis_url:
            self.redis_url = f"redis://127.0.0.1:{self.embedded_redis_port}/0"
        if not self.broker_url:
            self.broker_url = self.redis_url
        self.var_dir = Path(self.var_dir)
        return self

    def key(self, *parts: object) -> str:
        """Redis key under our prefix: `key("run", rid)` -> `cc:run:<rid>`."""
        return ":".join((self.key_prefix, *(str(p) for p in parts)))

    @property
    def redis_broker(self) -> bool:
        return is_redis_url(self.broker_url)

    @property
    def broker_key_prefix(self) -> str:
        """kombu's `global_keyprefix` on a Redis broker (worker.py): its queues, `unacked` and
        the rest live under our prefix, so two deployments share a Redis. "" elsewhere."""
        return f"{self.key_prefix}:q:" if self.redis_broker else ""


def is_redis_url(url: str) -> bool:
    """Whether a broker URL is kombu's Redis transport (TCP, TLS or a unix socket)."""
    return url.startswith(("redis", "rediss", "unix"))


@functools.lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def reset_settings() -> None:
    """Forget the cached settings (tests that change the environment call this)."""
    get_settings.cache_clear()


# --- per-site variables -------------------------------------------------------------------
# Settings a deployment sets per site (keys, accounts, agents, pool tuning) have names built
# from the site: `CHAINCRAWL_SIGN_KEY_DEMO`. They cannot be fields of `Settings`, so each
# family is declared here once, read through `site_env`, and checked against the sites that
# exist by `utils/envcheck.py` (a misspelled site or family is reported, never silently
# ignored).


@dataclass(frozen=True)
class SiteVar:
    """One family of per-site variables.

    `template` names the site-level variable with `{site}` and any other `{part}`; `default`
    (optional) names the variable for every site. Values are upper-cased into the name.
    `parts` lists the allowed values of a part (None: any); `secret` keeps the value out of
    every listing.
    """

    template: str
    description: str
    default: str | None = None
    parts: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    secret: bool = False

    def name(self, site: str, **parts: str) -> str:
        return "CHAINCRAWL_" + self.template.format(site=site, **parts).upper()

    def default_name(self, **parts: str) -> str | None:
        return "CHAINCRAWL_" + self.default.format(**parts).upper() if self.default else None


SITE_VARS: dict[str, SiteVar] = {
    "accounts": SiteVar(
        "ACCOUNTS_{site}",
        "Accounts of the site's login producer: `user:password` entries, comma-separated "
        "(else var/accounts/<site>.json|txt).",
        secret=True,
    ),
    "sign_key": SiteVar("SIGN_KEY_{site}", "The site's request-signing key.", secret=True),
    "user_agents": SiteVar(
        "UA_{site}_{family}",
        "JSON list of user agents of the site for one platform family.",
        parts={"family": ("pc", "h5", "app")},
    ),
    "captcha": SiteVar(
        "CAPTCHA_{site}",
        "Captcha recognizer of the site (a name in external_interface.captcha.recognizers).",
        default="CAPTCHA",
    ),
    "captcha_service": SiteVar(
        "CAPTCHA_SERVICE_{field}_{site}",
        "The `http` captcha recognizer's service: URL, KEY (secret), TIMEOUT seconds.",
        default="CAPTCHA_SERVICE_{field}",
        parts={"field": ("url", "key", "timeout")},
        secret=True,
    ),
    "pool": SiteVar(
        "POOL_{kind}_{site}",
        'JSON object of a resource pool\'s settings ({"low_water": 3}), over the kind-wide '
        "`CHAINCRAWL_POOL_<KIND>` (external_interface/pool.py).",
        default="POOL_{kind}",
        parts={"kind": None},
    ),
}


def site_env(key: str, site: str, environ: Mapping[str, str] | None = None, **parts: str
             ) -> str | None:  # fmt: skip
    """A per-site variable's value: the site's own, else the family's all-sites default.

    An empty value counts as unset."""
    var = SITE_VARS[key]
    env = os.environ if environ is None else environ
    for name in (var.name(site, **parts), var.default_name(**parts)):
        if name and env.get(name):
            return env[name]
    return None
