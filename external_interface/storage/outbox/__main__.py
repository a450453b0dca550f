"""`python -m external_interface.storage.outbox`: a drainer process of its own; SIGTERM flushes and exits."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

import orjson
import redis

from config import get_settings
from external_interface.storage.outbox.cluster import drainer_class
from external_interface.storage.outbox.status import backlog, requeue_dead
from utils.outage import first_line, stderr_notify
from utils.redis import address, be_patient, failed_node, get_redis

log = logging.getLogger("external_interface.storage.outbox")

DESCRIPTION = "The outbox drainer: moves committed items from the Redis stream `{prefix}:outbox` to the sinks."


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m external_interface.storage.outbox`: a drainer process; SIGTERM flushes and exits."""
    p = argparse.ArgumentParser(
        prog="python -m external_interface.storage.outbox", description=DESCRIPTION
    )
    p.add_argument(
        "--status",
        action="store_true",
        help="print the backlog as JSON and exit (on a Redis Cluster: every run's stream)",
    )
    p.add_argument("--once", action="store_true", help="drain what is there now, then exit")
    p.add_argument(
        "--requeue-dead",
        action="store_true",
        help="move dead letters back and exit (on a Redis Cluster: each run's to its own stream)",
    )
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--interval", type=float, default=None)
    p.add_argument("--claim-idle", type=float, default=None)
    args = p.parse_args(argv)
    settings = get_settings()
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.status or args.requeue_dead:
        return _operator_view(
            args.status, settings.redis_url, settings.key_prefix, settings.redis_wait
        )
    kw: dict[str, Any] = {}
    if args.claim_idle is not None:
        kw["claim_idle"] = args.claim_idle
    drainer = drainer_class(get_redis(settings.redis_url)).from_settings(settings, **kw)
    if args.batch:
        drainer.batch = args.batch
    if args.interval:
        drainer.interval = args.interval
    if args.once:
        try:
            n = drainer.drain_once(claim=True)
        finally:
            drainer.router.close()
        print(n)
        return 0

    def _on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: flushing and stopping", signum)
        drainer.request_stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    drainer.run()
    return 0


def _operator_view(status: bool, url: str, prefix: str, wait: float) -> int:
    """`--status` / `--requeue-dead`: like the CLI's views, through a Redis restart or a
    cluster failover (CHAINCRAWL_REDIS_WAIT), said in one line each way; past the wait, one
    line and exit 5, never a traceback."""
    startup = address(url)
    be_patient(wait, stderr_notify(startup, wait))
    try:
        r = get_redis(url)
        if status:
            out = orjson.dumps(backlog(r, prefix, scan=True), option=orjson.OPT_INDENT_2)
            sys.stdout.write(out.decode() + "\n")
        else:
            print(requeue_dead(r, prefix))
    except redis.RedisError as exc:
        where = failed_node(exc) or startup
        print(f"error: Redis at {where} did not answer: {first_line(exc)}", file=sys.stderr)
        return 5
    return 0


if __name__ == "__main__":
    sys.exit(main())
