"""Run endpoint code in-process with the real providers, pointed at a private Redis."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import external_interface.production  # noqa: F401 - registers the production endpoints
from base_task import Context, Follow, Item, get_endpoint
from config import get_settings, reset_settings
from external_interface.fetch import RequestsFetcher
from external_interface.pool import reset_pool_config
from monitor.metrics import TaskMetrics
from utils.redis import reset_clients


def _forget_cached_state() -> None:
    import base_task

    base_task._provider_cache.clear()  # providers keep the key prefix they were built with
    reset_settings()
    reset_clients()
    reset_pool_config()


@contextlib.contextmanager
def private_env(**env: str) -> Iterator[None]:
    """Set environment variables (CHAINCRAWL_REDIS_URL, ...) for this process, then restore."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _forget_cached_state()
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _forget_cached_state()


_fetcher = RequestsFetcher()


def run_online(
    name: str, params: Mapping[str, Any], metrics: TaskMetrics | None = None
) -> tuple[list[Item], list[Follow]]:
    """What a worker does with one task's code, minus the broker: providers included."""
    spec = get_endpoint(name)
    p = spec.validate_params(params)
    ctx = Context(spec, p, {}, get_settings(), metrics or TaskMetrics(), "t", _fetcher)
    return spec.task._collect(ctx, p)


def fetcher() -> RequestsFetcher:
    return _fetcher
