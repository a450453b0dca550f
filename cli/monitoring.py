"""`control.sh monitor`: the Prometheus exporter and the alert evaluator, in one process.

    ./control.sh monitor [start]   in the background (pid file var/run/monitor.pid, log var/log/)
    ./control.sh monitor run       in the foreground until Ctrl-C / SIGTERM
    ./control.sh monitor stop
    ./control.sh monitor check     validate the alert rules and print their current values

Run as `python -m cli.monitoring ...` too, so the background process does not depend on how
the command line is assembled.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from cli import UserError


def _settings() -> Any:
    from config import get_settings

    return get_settings()


def _monitor_settings(a: argparse.Namespace) -> Any:
    from settings.monitor import MonitorSettings

    ms = MonitorSettings()
    if getattr(a, "address", None):
        ms.address = a.address
    if getattr(a, "port", None) is not None:
        ms.port = a.port
    return ms


def _alert_config(a: argparse.Namespace) -> Any:
    from monitor.alerts import load_config

    try:
        return load_config(getattr(a, "alerts", None))
    except (ValueError, OSError) as exc:
        raise UserError(f"alert rules: {exc}") from None


def run(a: argparse.Namespace) -> None:
    """Foreground: exporter thread + evaluator loop until a signal."""
    from monitor.alerts import evaluator_from_settings
    from monitor.exporter import serve
    from settings.monitor import AlertSettings
    from worker import app

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    s = _settings()
    ms = _monitor_settings(a)
    cfg = _alert_config(a)
    try:
        server, note = serve(s, ms)
    except OSError as exc:
        raise UserError(f"cannot listen on {ms.address}:{ms.port}: {exc.strerror or exc}") from None
    logging.getLogger("chaincrawl.exporter").info("serving %s (%s)", server.url, note)
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        if a.no_alerts or not AlertSettings().enabled:
            stop.wait()
        else:
            evaluator_from_settings(s, cfg, app).run(stop)
    finally:
        server.close()


def start(a: argparse.Namespace) -> None:
    from cli import procs
    from monitor.exporter import is_loopback

    s = procs.settings()
    procs.ensure_redis(s)
    ms = _monitor_settings(a)
    cfg = _alert_config(a)  # fail here, not in the background
    cmd = [
        sys.executable,
        "-m",
        "cli.monitoring",
        "run",
        "--address",
        ms.address,
        "--port",
        str(ms.port),
    ]
    if a.alerts:
        cmd += ["--alerts", a.alerts]
    if a.no_alerts:
        cmd.append("--no-alerts")
    pid = procs.start_bg("monitor", cmd, s)
    host = "127.0.0.1" if ms.address in ("0.0.0.0", "") else ms.address
    # the exporter listens in this pid itself: another process on the port is not it
    procs.wait_listening("monitor", pid, "::1" if ms.address == "::" else host, ms.port, s, 20)
    print(f"monitor: http://{ms.address}:{ms.port}/metrics (pid {pid})")
    if ms.password or not is_loopback(ms.address):
        from monitor.exporter import monitor_password

        _, where = monitor_password(s, ms)
        print(f"  basic auth: user {ms.user!r}, password in {where}")
    print(
        f"  alerts: {len(cfg.rules)} rule(s) from {cfg.source or '(none)'}, "
        f"webhook {'set' if cfg.webhook else 'not set (log only)'}, log {s.var_dir / 'log' / 'monitor.log'}"
    )


def stop(a: argparse.Namespace) -> None:
    from cli import procs

    stopped = procs.stop_named("monitor", procs.settings(), 30)
    print("stopped: " + (", ".join(stopped) if stopped else "monitor was not running"))


def check(a: argparse.Namespace) -> None:
    """Validate the rules, then show each rule's current values (no state is changed)."""
    from rich.console import Console
    from rich.table import Table

    from cli import procs
    from monitor.alerts import Evaluator, celery_ping, rules_table
    from utils.redis import get_redis
    from worker import app

    s = _settings()
    cfg = _alert_config(a)
    procs.require_redis(s)  # read-only: never starts the embedded Redis
    console = Console()
    console.print(
        f"rules: {cfg.source or '(none)'}; interval {cfg.interval:g}s; "
        f"webhook {'set' if cfg.webhook else 'not set (log only)'}"
    )
    ev = Evaluator(get_redis(s.redis_url), cfg, s, ping=lambda: celery_ping(app))
    values = ev.values()
    t = Table("rule", "kind", "limit", "window", "for", "values now")
    for row, rule in zip(rules_table(cfg), cfg.rules, strict=True):
        vals = values.get(rule.name, {})
        shown = ", ".join(
            f"{k}={'n/a' if v is None else format(v, '.3g')}{' !' if rule.breached(v) else ''}"
            for k, v in sorted(vals.items())[:8]
        )
        t.add_row(*row, shown or "(no subjects yet)")
    console.print(t)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="listen address (CHAINCRAWL_MONITOR_ADDRESS, 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (CHAINCRAWL_MONITOR_PORT, 9808)")
    p.add_argument("--alerts", help="alert rules file (CHAINCRAWL_ALERTS_FILE, alerts.yaml)")
    p.add_argument("--no-alerts", action="store_true", help="serve /metrics only")


def dispatch(a: argparse.Namespace) -> None:
    {"start": start, "run": run, "stop": stop, "check": check}[a.action](a)


def register(sub: Any) -> None:
    p = sub.add_parser("monitor", help="Prometheus /metrics and alerts (start|run|stop|check)")
    p.add_argument("action", nargs="?", default="start", choices=["start", "run", "stop", "check"])
    _add_common(p)
    p.set_defaults(fn=dispatch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.monitoring")
    parser.add_argument(
        "action", nargs="?", default="run", choices=["start", "run", "stop", "check"]
    )
    _add_common(parser)
    a = parser.parse_args(argv)
    try:
        dispatch(a)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
