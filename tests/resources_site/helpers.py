"""Run endpoint code in-process with the real providers, pointed at a private Redis."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import sites.demo.production  # noqa: F401 - registers the production endpoints
from base_task import Context, Follow, Item, get_endpoint
from config import reset_settings
from external_interface.fetch import RequestsFetcher
from external_interface.resources.pool import reset_pool_config
from lifecycle import runtime
from monitor.metrics import TaskMetrics
from utils import environ
from utils.redis import reset_clients
from utils.wire import TaskMeta


def _forget_cached_state() -> None:
    reset_settings()  # a new settings object: a new runtime, so new providers (key prefix)
    reset_clients()
    reset_pool_config()


@contextlib.contextmanager
def private_env(**env: str) -> Iterator[None]:
    """Set environment variables (CHAINCRAWL_REDIS_URL, ...) for this process, then restore."""
    saved = environ.apply(env)
    _forget_cached_state()
    try:
        yield
    finally:
        environ.restore(saved)
        _forget_cached_state()


_fetcher = RequestsFetcher()


def run_online(
    name: str, params: Mapping[str, Any], metrics: TaskMetrics | None = None
) -> tuple[list[Item], list[Follow]]:
    """What a worker does with one task's code, minus the broker: providers included."""
    spec = get_endpoint(name)
    p = spec.validate_params(params)
    ctx = Context(spec, p, TaskMeta(), runtime.current(), metrics or TaskMetrics(), _fetcher)
    return spec.task._collect(ctx, p)


def fetcher() -> RequestsFetcher:
    return _fetcher
