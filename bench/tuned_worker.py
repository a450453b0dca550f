"""A Celery app module for benchmark workers: `worker.app` with the prototypes named in
`BENCH_PROTO` applied (bench/proto.py). Start with `celery -A bench.tuned_worker worker ...`.

With no BENCH_PROTO it is exactly `worker`.
"""

from __future__ import annotations

from bench import proto
from worker import app

proto.apply(app, proto.flags())

__all__ = ["app"]
