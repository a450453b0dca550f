"""`control.sh report [RUN_ID | --site S | --since 24h] --out report.html`: how the crawls went,
as one self-contained HTML file (monitor/report)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli import UserError, procs
from monitor.report import parse_since, write_report
from utils.redis import get_redis


def main(a: argparse.Namespace) -> int:
    if a.run_id and (a.site or a.since):
        raise UserError("report: give RUN_ID, or --site and/or --since, not both")
    try:
        since = parse_since(a.since) if a.since else None
    except ValueError as e:
        raise UserError(str(e)) from None
    out = Path(a.out)
    if not out.parent.is_dir():
        raise UserError(f"--out {a.out}: there is no directory {out.parent}")
    s = procs.settings()
    procs.ensure_redis(s)
    try:
        data = write_report(
            out, get_redis(s.redis_url), s, run_id=a.run_id, site=a.site, since=since
        )
    except LookupError as e:
        raise UserError(str(e.args[0])) from None
    t = data["totals"]
    print(
        f"wrote {out}: {t['runs']} run(s), {t['pages']} pages, {t['items']} items, "
        f"{t['errors']} errors",
        file=sys.stderr,
    )
    return 0
