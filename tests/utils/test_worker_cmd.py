"""The `celery worker` command line `control.sh start` and the benchmarks share."""

from __future__ import annotations

import sys

from utils.worker_cmd import worker_argv

CELERY = [sys.executable, "-m", "celery"]


def test_the_worker_command_as_control_sh_starts_it() -> None:
    argv = worker_argv(app="worker", pool="threads", concurrency=8, queues="demo,default",
                       node="w1@%h", events=False)  # fmt: skip
    assert argv == [*CELERY, "-A", "worker", "worker", "-P", "threads", "-c", "8",
                    "-Q", "demo,default", "-n", "w1@%h", "-l", "INFO", "--without-gossip",
                    "--without-mingle", "--heartbeat-interval", "10"]  # fmt: skip


def test_task_events_come_before_the_log_level_and_extra_flags_last() -> None:
    argv = worker_argv(app="bench.tuned_worker", pool="gevent", concurrency=256, queues="benchsite",
                       node="b1@%h", events=True, extra=["--prefetch-multiplier", "4"])  # fmt: skip
    assert argv == [*CELERY, "-A", "bench.tuned_worker", "worker", "-P", "gevent", "-c", "256",
                    "-Q", "benchsite", "-n", "b1@%h", "-E", "-l", "INFO", "--without-gossip",
                    "--without-mingle", "--heartbeat-interval", "10", "--prefetch-multiplier", "4"]  # fmt: skip
