"""The resource-provider interface the fetch layer calls around every request.

A provider prepares an outgoing request (adds a proxy, a user agent, a cookie, a signature,
a device id) and hears how it went (latency, status, error) so it can score, rotate or retire
the resource it lent. An endpoint names the kinds it needs (`@endpoint(resources=[...])`);
each kind's provider is chosen by name from `providers` (`CHAINCRAWL_PROVIDERS` may pick
another per site); the defaults here do nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from utils.registry import Registry


@dataclass
class OutgoingRequest:
    """A request about to be sent; providers may change any field."""

    method: str
    url: str
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)
    data: Any = None
    json: Any = None
    proxy: str | None = None  # full proxy URL (may carry credentials; never log it)
    # Opaque ids of the resources lent for this request ({"proxy": "1.2.3.4:8080", ...}),
    # so feedback reaches the right pool entry and a retry can avoid what just failed.
    leases: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    """What happened to a request: exactly one of `status` or `error` is normally set."""

    elapsed: float
    status: int | None = None
    error: BaseException | None = None
    text_sample: str = ""  # first bytes of the body, for ban detection (login wall, captcha)
    retry_after: float | None = None  # the answer's Retry-After (s): how long a ban holds

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and self.status < 400


class TaskState(Protocol):
    """What a provider may read about the task it serves (see base_task.Context)."""

    site: str
    platform: str
    task_name: str
    avoid: set[str]  # resource ids ("proxy:1.2.3.4:8080") that failed this task before


class Provider(Protocol):
    """Lends one kind of resource to requests. Both methods must be cheap and thread-safe."""

    kind: str  # "proxy", "user_agent", "cookie", "sign", "device_id"

    def prepare(self, req: OutgoingRequest, task: TaskState) -> None: ...

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: TaskState) -> None: ...

    # Optional: `cancel(req, task)` returns what `prepare` lent when a later provider failed
    # to prepare, so the request is never sent.


class NoopProvider:
    """The default for every kind: lends nothing, hears nothing."""

    def __init__(self, kind: str = "noop") -> None:
        self.kind = kind

    def prepare(self, req: OutgoingRequest, task: TaskState) -> None:
        return None

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: TaskState) -> None:
        return None


# name -> factory(site: str, platform: str) -> Provider
providers: Registry = Registry("resource provider")
providers.add("noop", lambda site, platform: NoopProvider())

# Modules that register providers when imported; missing ones are skipped.
PROVIDER_MODULES = (
    "external_interface.resources.proxy",
    "external_interface.resources.user_agent",
    "external_interface.resources.device_id",
    "external_interface.resources.cookie",
    "external_interface.resources.sign",
    "external_interface.resources.captcha",
)


def load_providers() -> None:
    import importlib

    for mod in PROVIDER_MODULES:
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            if exc.name != mod:
                raise


def provider_name(site: str, kind: str, declared: str, overrides: str) -> str:
    """Which provider serves `kind` for `site`: `site.kind=` beats `kind=` beats the
    endpoint's declaration (CHAINCRAWL_PROVIDERS)."""
    table = dict(part.strip().split("=", 1) for part in overrides.split(",") if "=" in part)
    return table.get(f"{site}.{kind}") or table.get(kind) or declared
