"""Flower as `control.sh flower` runs it: `celery -A worker flower`, with its `/metrics` and
`/healthcheck` behind the same credentials as its pages whenever it listens beyond loopback.

Flower serves those two to anyone, whatever its auth options (they are meant for a local
scraper); bound to 0.0.0.0 or a LAN address they would tell whoever asks the worker names,
task names and counts. Here, on such an address, they answer 401 without valid credentials
(Flower's basic auth or OAuth login), and 403 when Flower has no credentials configured at
all. On a loopback address they stay open: only this machine reaches them.

    python -m monitor.flower --address=0.0.0.0 --port=5555    # options as for `celery flower`
"""

from __future__ import annotations

import sys
from typing import Any

import tornado.web
from celery.bin.celery import main as celery_main
from flower import urls
from flower.views.monitor import Healthcheck, Metrics

from utils.servers import is_loopback


class _Guarded(tornado.web.RequestHandler):
    """Checks credentials before the handler runs, unless Flower listens on loopback only."""

    application: Any

    def prepare(self) -> None:
        options = self.application.options
        if is_loopback(options.address):
            return
        if not (options.basic_auth or options.auth):
            raise tornado.web.HTTPError(403, "Flower listens beyond loopback without credentials")
        if not self.current_user:  # basic auth raises 401 itself on missing or wrong ones
            raise tornado.web.HTTPError(401)


class GuardedMetrics(_Guarded, Metrics):
    pass


class GuardedHealthcheck(_Guarded, Healthcheck):
    pass


GUARDED: dict[type, type] = {Metrics: GuardedMetrics, Healthcheck: GuardedHealthcheck}


def guard() -> None:
    """Serve `/metrics` and `/healthcheck` through the guarded handlers (Flower builds its
    application from this list when it starts)."""
    for i, handler in enumerate(urls.handlers):
        if isinstance(handler, tuple) and handler[1] in GUARDED:
            urls.handlers[i] = (handler[0], GUARDED[handler[1]], *handler[2:])


def main(argv: list[str] | None = None) -> None:
    guard()
    sys.argv = ["celery", "-A", "worker", "flower", *(sys.argv[1:] if argv is None else argv)]
    celery_main()


if __name__ == "__main__":
    main()
