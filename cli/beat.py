"""`python -m cli.beat`: Celery beat for periodic chains, as `./control.sh beat` starts it."""

from __future__ import annotations

import argparse
import sys

from exceptions import ConfigError
from external_interface.resources.proxy.tasks import PROXY_BEAT_SCHEDULE
from scheduling.periodic import DEFAULT_SCHEDULE, run_beat
from worker import app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m cli.beat", description="Celery beat for periodic chains"
    )
    ap.add_argument("--schedule", default=str(DEFAULT_SCHEDULE), help="schedule file (YAML)")
    ap.add_argument("--loglevel", default="INFO")
    a = ap.parse_args(argv)
    try:  # the proxy pool's harvesters and validators run on the same beat
        run_beat(app, a.schedule, a.loglevel, PROXY_BEAT_SCHEDULE)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
