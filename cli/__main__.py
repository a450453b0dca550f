"""`python -m cli COMMAND` — what `control.sh` runs after making sure the venv exists."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from cli import UserError
from config import DEFAULT_POOL, POOLS


def _seeds(text: str | None) -> list[dict[str, Any]] | None:
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"seeds are not valid JSON ({exc.msg} at column {exc.colno}): {text!r}"
        ) from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise UserError("seeds must be a JSON object or a list of objects, e.g. '[{\"page\": 1}]'")
    return data


def cmd_start(a: argparse.Namespace) -> None:
    from cli import procs

    s = procs.settings()
    print(f"redis: {procs.ensure_redis(s)} ({s.redis_url.split('@')[-1]})")
    queues = a.queues or ",".join(_all_queues())
    names = procs.start_workers(
        s, queues, a.pool, a.concurrency, a.workers, a.name, fetch_slots=a.fetch_slots
    )
    procs.wait_workers_ready(names, s)
    slots = f", fetch slots={a.fetch_slots}" if a.fetch_slots else ""
    print(
        f"workers ready: {', '.join(names)} (pool={a.pool}, concurrency={a.concurrency}{slots}, "
        f"queues={queues})"
    )
    print(f"logs: {s.var_dir / 'log'}")


def _all_queues() -> list[str]:
    import worker

    return worker.queues()


def cmd_stop(a: argparse.Namespace) -> None:
    from cli import procs

    s = procs.settings()
    stopped = procs.stop_named("worker-", s, a.timeout)  # warm shutdown: running tasks finish
    for other in ("beat", "flower", "monitor", "demo-site", "drainer"):
        stopped += procs.stop_named(other, s, 30)
    if not a.keep_redis and procs.stop_redis(s):
        stopped.append("embedded redis")
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


def cmd_status(a: argparse.Namespace) -> None:
    from cli import procs, status

    s = procs.settings()
    if not procs.port_open(*_redis_hostport(s)):
        raise UserError("Redis is not running: start it with ./control.sh start")
    status.main(a)


def _redis_hostport(s: Any) -> tuple[str, int]:
    from urllib.parse import urlparse

    u = urlparse(s.redis_url)
    return u.hostname or "127.0.0.1", u.port or 6379


def cmd_flower(a: argparse.Namespace) -> None:
    from cli import procs

    s = procs.settings()
    procs.ensure_redis(s)
    url, where = procs.start_flower(s)
    print(f"flower: {url} (user {s.flower_user!r}, password in {where})")


def cmd_trigger(a: argparse.Namespace) -> None:
    from cli import procs, runs

    s = procs.settings()
    procs.ensure_redis(s)
    result = runs.trigger(a.chain, _seeds(a.seeds), a.priority, not a.no_wait, a.timeout)
    if not a.no_wait and not result.complete:  # type: ignore[union-attr]
        if result.status == "cancelled":  # type: ignore[union-attr]
            raise UserError(f"run {result.run_id} was cancelled")  # type: ignore[union-attr]
        raise UserError(
            f"run not complete after {a.timeout}s (it goes on; see ./control.sh status)"
        )


def cmd_cancel(a: argparse.Namespace) -> None:
    import chains
    from cli import procs

    procs.ensure_redis(procs.settings())
    out = chains.cancel(a.run_id, a.reason or "")
    if out.was in ("done", "cancelled"):
        print(f"run {a.run_id} had already ended ({out.was}): nothing to cancel")
        return
    print(f"run {a.run_id} cancelled: {out.dropped} waiting task(s) dropped; "
          f"{out.outstanding} in the broker or running will be skipped as they come up "
          "(items already stored stay)")  # fmt: skip


def cmd_runs(a: argparse.Namespace) -> None:
    from cli import procs, runs

    procs.ensure_redis(procs.settings())
    runs.show(a.run_id, a.limit, a.json, a.chain, a.status)


def _run_targets(a: argparse.Namespace) -> list[str]:
    """RUN_ID, or with --chain / --all the active runs of that chain / every active run."""
    from chains.state import RunState
    from utils.redis import get_redis

    given = [x for x in (a.run_id, a.chain, a.all) if x]
    if len(given) != 1:
        raise UserError(f"{a.cmd}: give one of RUN_ID, --chain NAME or --all")
    if a.run_id:
        return [a.run_id]
    rids = RunState(get_redis()).active_runs(a.chain)
    if not rids:
        print(f"no active runs{f' of chain {a.chain}' if a.chain else ''}")
    return rids


def cmd_pause(a: argparse.Namespace) -> None:
    import chains
    from cli import procs

    procs.ensure_redis(procs.settings())
    for rid in _run_targets(a):
        out = chains.pause(rid, a.reason or "")
        if out.was == "paused":
            print(f"run {rid} was already paused")
        elif out.was != "running":
            print(f"run {rid} is {out.was}: nothing to pause")
        else:
            print(f"run {rid} paused: tasks running now finish; the rest wait until "
                  f"./control.sh resume {rid}")  # fmt: skip


def cmd_resume(a: argparse.Namespace) -> None:
    import chains
    from cli import procs

    procs.ensure_redis(procs.settings())
    for rid in _run_targets(a):
        out = chains.resume(rid)
        if out.was != "paused":
            print(f"run {rid} is {out.was}, not paused: nothing to resume")
        else:
            print(f"run {rid} resumed: {out.released} waiting task(s) sent")


def cmd_deadletter(a: argparse.Namespace) -> None:
    from cli import deadletter

    if a.action == "list":
        deadletter.list_view(a.limit, a.task, a.verbose, a.run)
    else:
        if not a.ids and not a.all:
            raise UserError("replay needs dead-letter ids or --all")
        n = deadletter.replay(a.ids, a.all, a.task, a.run)
        print(f"replayed {n} task(s)")


def cmd_chains(a: argparse.Namespace) -> None:
    import chains

    for name in chains.names():
        ch = chains.get_chain(name)
        print(f"{name}: " + " | ".join(f"{sid}={st.task}" for sid, st in ch.steps.items()))


def cmd_config(a: argparse.Namespace) -> None:
    """The CHAINCRAWL_* variables set (names only: values may be secrets), and any that
    nothing reads."""
    from utils import envcheck

    names = sorted(n for n in os.environ if n.startswith(envcheck.PREFIX))
    print(f"{len(names)} CHAINCRAWL_* variable(s) set" + (": " + ", ".join(names) if names else ""))
    problems = envcheck.current()
    for p in problems:
        print(f"  {p}")
    if problems:
        raise UserError(f"{len(problems)} variable(s) that nothing reads (misspelled?)")
    if names:
        print("each is read by chaincrawl")


def cmd_redis(a: argparse.Namespace) -> None:
    from cli import procs

    s = procs.settings()
    if a.action == "start":
        print(f"redis: {procs.ensure_redis(s)} at {s.redis_url.split('@')[-1]}")
    else:
        print("stopped" if procs.stop_redis(s) else "embedded redis was not running")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="control.sh", description="chaincrawl control")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    st = sub.add_parser("start", help="start workers (and the embedded Redis if needed)")
    st.add_argument("--queues", help="comma-separated queues (default: every site + resources)")
    st.add_argument("--pool", default=DEFAULT_POOL,
                    help=f"{DEFAULT_POOL} (default), " + ", ".join(p for p in POOLS if p != DEFAULT_POOL))  # fmt: skip
    st.add_argument("--concurrency", "-c", type=int, default=16, help="slots per worker (16)")
    st.add_argument("--fetch-slots", type=int, default=None,
                    help="most requests in flight per worker (default: CHAINCRAWL_FETCH_SLOTS, "
                    "else one per slot); e.g. -c 20 --fetch-slots 16 keeps 16 requests "
                    "going while finished pages parse")  # fmt: skip
    st.add_argument("--workers", "-n", type=int, default=os.cpu_count() or 1,
                    help="worker processes on this machine (default: one per core)")  # fmt: skip
    st.add_argument("--name", default="w", help="worker name prefix (w)")
    st.set_defaults(fn=cmd_start)

    sp = sub.add_parser("stop", help="warm-stop workers and everything control.sh started")
    sp.add_argument("--timeout", type=float, default=120, help="seconds to let tasks finish")
    sp.add_argument("--keep-redis", action="store_true", help="leave the embedded Redis running")
    sp.set_defaults(fn=cmd_stop)

    ss = sub.add_parser("status", help="workers, queues, runs, dead letters, backlog")
    ss.add_argument("--json", action="store_true", help="machine-readable snapshot")
    ss.add_argument("--watch", action="store_true", help="refresh live until Ctrl-C")
    ss.add_argument("--interval", type=float, default=1.0)
    ss.add_argument("--inspect-timeout", type=float, default=1.0,
                    help="seconds to wait for workers to answer")  # fmt: skip
    ss.add_argument("--no-workers", action="store_true", help="skip asking the workers")
    ss.set_defaults(fn=cmd_status)

    fl = sub.add_parser("flower", help="start Flower (basic auth on)")
    fl.set_defaults(fn=cmd_flower)

    tr = sub.add_parser("trigger", help="start a chain run and show its live progress")
    tr.add_argument("chain")
    tr.add_argument("seeds", nargs="?", help="JSON object or list of objects (root parameters)")
    tr.add_argument("--priority", type=int, help="0..9, 9 most urgent")
    tr.add_argument("--no-wait", action="store_true", help="print the run id and return")
    tr.add_argument("--timeout", type=float, default=None)
    tr.set_defaults(fn=cmd_trigger)

    ru = sub.add_parser("runs", help="the newest runs (finished too), or one run's steps")
    ru.add_argument("run_id", nargs="?")
    ru.add_argument("--limit", type=int, default=20)
    ru.add_argument("--json", action="store_true")
    ru.add_argument("--chain", help="only this chain's runs")
    ru.add_argument("--status", choices=["running", "paused", "cancelling", "done", "cancelled"])
    ru.set_defaults(fn=cmd_runs)

    for name, fn, what, reason in (
        ("cancel", cmd_cancel, "stop a run (workers and other runs go on)", "kept with the run"),
        ("pause", cmd_pause, "hold a run without losing its place (resume goes on)",
         "kept with the run while it is paused"),
        ("resume", cmd_resume, "let a paused run go on", ""),
    ):  # fmt: skip
        rc = sub.add_parser(name, help=what)
        if name == "cancel":  # one run at a time: cancelling is not undone
            rc.add_argument("run_id")
        else:  # a site under maintenance, a proxy provider down: hold a chain's runs, or all
            rc.add_argument("run_id", nargs="?")
            rc.add_argument("--chain", help="every active run of this chain")
            rc.add_argument("--all", action="store_true", help="every active run")
        if reason:
            rc.add_argument("--reason", help=reason)
        rc.set_defaults(fn=fn, cmd=name)

    dl = sub.add_parser("deadletter", help="list or replay tasks that failed for good")
    dl.add_argument("action", choices=["list", "replay"])
    dl.add_argument("ids", nargs="*")
    dl.add_argument("--all", action="store_true")
    dl.add_argument("--task", help="only this task name")
    dl.add_argument("--run", help="only this run's tasks")
    dl.add_argument("--limit", type=int, default=50)
    dl.add_argument("--verbose", "-v", action="store_true", help="show tracebacks")
    dl.set_defaults(fn=cmd_deadletter)

    ch = sub.add_parser("chains", help="list the defined chains")
    ch.set_defaults(fn=cmd_chains)

    cf = sub.add_parser("config", help="check the CHAINCRAWL_* variables for misspellings")
    cf.set_defaults(fn=cmd_config)

    rd = sub.add_parser("redis", help="start/stop the embedded Redis")
    rd.add_argument("action", choices=["start", "stop"])
    rd.set_defaults(fn=cmd_redis)

    for mod in (
        "cli.demo",
        "cli.newsite",
        "cli.ops",
        "cli.monitoring",
    ):  # command groups added by other issues
        try:
            __import__(mod)
        except ImportError as exc:
            if exc.name != mod:
                raise
            continue
        sys.modules[mod].register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from exceptions import ChainCrawlError

    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except (UserError, ChainCrawlError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
