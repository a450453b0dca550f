"""`control.sh beat` (periodic chains) and `control.sh limits` (shared rate limits, live).

    ./control.sh beat                      start Celery beat in the background (var/log/beat.log)
    ./control.sh beat --schedule FILE      another schedule file (default: schedules.yaml)
    ./control.sh beat --check              validate the file and list its entries; start nothing
    ./control.sh beat --status             each entry's latest run and last decision
    ./control.sh beat --foreground         run beat in this terminal (containers, systemd)
    ./control.sh limits [--json]           configured limits, leases held, token backlog

Run one beat per deployment: beat only sends trigger messages, and the trigger task refuses
to start a run while the entry's previous run is still going (scheduling/tasks.py).
`control.sh stop` stops beat along with the workers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from cli import UserError


def _schedule_path(a: argparse.Namespace) -> Path:
    from scheduling.periodic import DEFAULT_SCHEDULE

    p = Path(a.schedule).expanduser() if a.schedule else DEFAULT_SCHEDULE
    return p.resolve()


def cmd_beat(a: argparse.Namespace) -> None:
    from cli import beat, procs
    from scheduling import periodic

    path = _schedule_path(a)
    schedule = periodic.load_schedule(path)  # ConfigError names the bad entry
    if a.status:
        _beat_status(schedule)
        return
    print(f"schedule {path}:")
    for line in periodic.describe(schedule) or ["(no entries)"]:
        print(f"  {line}")
    if a.check:
        return
    s = procs.settings()
    procs.ensure_redis(s)
    if a.foreground:
        beat.main(["--schedule", str(path), "--loglevel", a.loglevel])
        return
    pidfile = procs.run_dir(s) / "beat.pid"
    if (pid := procs.alive(pidfile)) is not None:
        raise UserError(f"beat is already running (pid {pid}); ./control.sh stop, or kill {pid}")
    logf = procs.log_dir(s) / "beat.log"
    offset = logf.stat().st_size if logf.exists() else 0
    cmd = [sys.executable, "-m", "cli.beat", "--schedule", str(path), "--loglevel", a.loglevel]
    pid = procs.start_bg("beat", cmd, s)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = logf.read_bytes()[offset:] if logf.exists() else b""
        if b"beat: Starting" in text:
            print(f"beat running (pid {pid}); log: {logf}")
            return
        if procs.alive(pidfile) is None:
            tail = text.decode(errors="replace")[-1500:]
            raise UserError(f"beat exited during start; see {logf}\n{tail}")
        time.sleep(0.2)
    raise UserError(f"beat did not report starting within 30 s; see {logf}")


def _beat_status(schedule: Any) -> None:
    from cli import procs
    from ledger.state import RunState
    from scheduling.tasks import entry_key
    from utils.redis import as_str, get_redis

    procs.require_redis(procs.settings())  # read-only: never starts the embedded Redis
    r = get_redis()
    state = RunState(r)
    for e in schedule.entries:
        h = {as_str(k): as_str(v) for k, v in r.hgetall(entry_key(e.name)).items()}
        run = h.get("run", "")
        status = state.info(run).get("status", "expired") if run else "-"
        print(
            f"{e.name}: latest run {run or '-'} ({status}); last check: {h.get('last_outcome', 'never')}"
        )


def cmd_limits(a: argparse.Namespace) -> None:
    from cli import procs
    from scheduling.gate import politeness_report

    procs.require_redis(procs.settings())  # read-only: never starts the embedded Redis
    report = politeness_report()  # ConfigError names a bad entry
    if a.json:
        print(json.dumps(report, indent=2))
        return
    if not report["limits"]:
        print("limits: none (CHAINCRAWL_LIMITS unset, CHAINCRAWL_DEFAULT_LIMITS=off)")
    for row in report["limits"]:
        live = []
        if row["in_flight"] is not None:
            live.append(f"{row['in_flight']} in flight")
        if row["backlog"]:
            live.append(f"{row['backlog']:.2f}s of tokens reserved ahead")
        scope = row["scope"] + (" (each site without its own entry)" if row["scope"] == "*" else "")
        print(f"{scope}: {row['limits']}" + (f"  [{', '.join(live)}]" if live else ""))
    rd = report["render"]
    own = f"; own entries: {', '.join(rd['scopes'])}" if rd["scopes"] else ""
    print(f"renders per site (<site>.render): {rd['default']} (CHAINCRAWL_BROWSER_SITE_LIMIT){own}")
    t = report["throttle"]
    if not t["on"]:
        print("adaptive delay: off (CHAINCRAWL_THROTTLE)")
    else:
        print(
            f"adaptive delay: on, aiming at {t['target_concurrency']:g} request(s) in flight "
            f"per site; starts at {t['start_delay']:g}s, at most {t['max_delay']:g}s; "
            f"Retry-After honoured up to {t['max_retry_after']:g}s"
        )
        for row in t["sites"]:
            paused = f", paused {row['paused_for']:.1f}s more" if row["paused_for"] else ""
            print(
                f"  {row['site']}: delay {row['delay']:.3f}s, latency {row['latency']:.3f}s "
                f"({row['samples']} answers, {row['backoffs']} back-offs{paused})"
            )
    r = report["robots"]
    ignored = f"; not for {', '.join(r['ignored_sites'])}" if r["ignored_sites"] else ""
    print(
        f"robots.txt: {'honoured' if r['on'] else 'off'} (user agent {r['user_agent']!r}, "
        f"kept {r['ttl']:g}s{ignored}); a site's requests wait {r['error_ttl']:g}s after its "
        f"robots.txt answers 5xx/429 (CHAINCRAWL_ROBOTS_ERROR_TTL), "
        f"{r['unreachable_ttl']:g}s after a fetch of it gets no answer, doubling with each "
        f"in a row up to {r['error_ttl']:g}s (CHAINCRAWL_ROBOTS_UNREACHABLE_TTL)"
    )


def register(sub: Any) -> None:
    b = sub.add_parser("beat", help="start Celery beat for the periodic chains in schedules.yaml")
    b.add_argument("--schedule", help="schedule file (default: schedules.yaml at the repo root)")
    mode = b.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="validate and list the entries only")
    mode.add_argument("--status", action="store_true", help="each entry's latest run")
    mode.add_argument("--foreground", action="store_true", help="run in this terminal")
    b.add_argument("--loglevel", default="INFO")
    b.set_defaults(fn=cmd_beat)

    lim = sub.add_parser("limits", help="shared rate limits and concurrency caps, with live usage")
    lim.add_argument("--json", action="store_true")
    lim.set_defaults(fn=cmd_limits)
