"""`python -m cli COMMAND` (the `chaincrawl` command) — what `control.sh` runs after making
sure the venv exists.

Only the standard library and `cli.parser` are imported before the command line is parsed:
`--help` and a usage error must not pay for redis-py, kombu or the settings (docs/cli.md
gives the timings); each command imports what it needs when it runs."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli import REDIS_UNREACHABLE, UserError
from cli.parser import SHELL_COMMANDS, parse

if TYPE_CHECKING:
    from config import Settings


def _seeds(text: str | None) -> list[dict[str, Any]] | None:
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"seeds are not valid JSON ({exc.msg} at column {exc.colno}): {text[:200]!r}"
        ) from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        got = (
            f"a JSON {_json_kind(data)}"
            if not isinstance(data, list)
            else f"a list whose item {next(i for i, d in enumerate(data) if not isinstance(d, dict))} "
            f"is a JSON {_json_kind(next(d for d in data if not isinstance(d, dict)))}"
        )
        raise UserError(
            f"seeds must be a JSON object or a list of objects, e.g. '[{{\"page\": 1}}]'; got {got}"
        )
    return data


def _json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words (a string, a number, ...)."""
    kinds = ((bool, "boolean"), (str, "string"), (int, "number"), (float, "number"), (list, "list"))
    return next((name for t, name in kinds if isinstance(value, t)), "null")


def _seeds_file(path: str) -> list[dict[str, Any]]:
    """Seeds from a file ('-': standard input): one JSON list (or object), or JSON lines. A
    file has no length limit, where a command-line argument stops at the system's ARG_MAX."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--seeds-file {path}: {exc}") from None
    where = "standard input" if path == "-" else path
    try:
        seeds = _seeds(text) or []
    except UserError:
        seeds = _json_lines(text, where)
    if not seeds:
        raise UserError(f"{where}: no seeds")
    return seeds


def _json_lines(text: str, where: str) -> list[dict[str, Any]]:
    seeds = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            seed = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"{where} line {n}: not JSON ({exc.msg} at column {exc.colno}); "
                "expected a JSON list or one JSON object per line"
            ) from None
        if not isinstance(seed, dict):
            raise UserError(f"{where} line {n}: a seed must be a JSON object")
        seeds.append(seed)
    return seeds


def cmd_start(a: argparse.Namespace) -> None:
    from cli import checks, procs

    s = procs.settings()
    for warning in unknown_queues(a.queues or ""):
        print(f"warning: {warning}", file=sys.stderr)
    for problem in checks.sink_problems():  # no site package imported: a site's own sink
        print(f"warning: {problem} (no item is stored unless a site registers it)", file=sys.stderr)
    print(f"redis: {procs.ensure_redis(s)} ({s.redis_url.split('@')[-1]})")
    queues = a.queues or ",".join(_all_queues())
    names = procs.start_workers(
        s, queues, a.pool, a.concurrency, a.workers, a.name, fetch_slots=a.fetch_slots
    )
    procs.wait_workers_ready(names, s)
    _settings_warnings(_live_sites(s))
    slots = f", fetch slots={a.fetch_slots}" if a.fetch_slots else ""
    print(
        f"workers ready: {', '.join(names)} (pool={a.pool}, concurrency={a.concurrency}{slots}, "
        f"queues={queues})"
    )
    print(f"logs: {s.var_dir / 'log'}")


def _live_sites(s: Settings) -> set[str]:
    """The sites the live workers loaded (their tasks' first name part), read from Redis."""
    from broker.workers import TaskSets
    from utils.redis import get_redis

    live = TaskSets(get_redis(s.redis_url), s).live().values()
    return {t.split(".", 1)[0] for w in live for t in w.tasks if "." in t}


def unknown_queues(queues: str) -> list[str]:
    """`start --queues` names that no site, endpoint or chain step sends to: a typo'd queue
    makes a worker that waits for ever while the site's tasks pile up unserved. A warning,
    not a refusal: a queue may be one a chain file loaded later names."""
    import difflib

    import chains
    import sites
    from broker.app import BASE_QUEUES

    asked = [q.strip() for q in queues.split(",") if q.strip() and q.strip() not in BASE_QUEUES]
    if not asked:
        return []
    try:  # the site packages imported here too: one that fails is the workers' to report
        known = {*sites.sites(), *BASE_QUEUES}
    except (Exception, SystemExit):
        return []
    for name in chains.names():
        known.update(st.options.queue or "" for st in chains.get_chain(name).root.walk())
    known.discard("")
    out = []
    for q in (q for q in asked if q not in known):
        near = difflib.get_close_matches(q, sorted(known), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f" (queues: {', '.join(sorted(known))})"
        out.append(f"queue {q!r} is no site's or chain step's queue{hint}")
    return out


def _all_queues() -> list[str]:
    import worker

    return worker.queues()


def cmd_stop(a: argparse.Namespace) -> None:
    from cli import procs

    s = procs.settings()
    stopped = procs.stop_named("worker-", s, a.timeout)  # warm shutdown: running tasks finish
    for other in ("beat", "flower", "monitor", "demo-site", "drainer"):
        stopped += procs.stop_named(other, s, 30)
    unfinished = procs.unfinished_runs(s)  # read before the embedded Redis stops
    if not a.keep_redis and procs.stop_redis(s):
        stopped.append("embedded redis")
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    if unfinished:
        shown = ", ".join(unfinished[:5]) + (", ..." if len(unfinished) > 5 else "")
        print(
            f"not finished: {len(unfinished)} run(s) ({shown}); their tasks wait in the broker "
            "and go on when workers start again (./control.sh start; ./control.sh cancel "
            "RUN_ID ends one)"
        )


def cmd_status(a: argparse.Namespace) -> None:
    from cli import procs, status

    procs.require_redis(procs.settings())  # read-only: never starts the embedded Redis
    status.main(a)


def cmd_flower(a: argparse.Namespace) -> None:
    from cli import procs

    s = procs.settings()
    procs.ensure_redis(s)
    url, where = procs.start_flower(s)
    print(f"flower: {url} (user {s.flower_user!r}, password in {where})")


def cmd_trigger(a: argparse.Namespace) -> int:
    """Exit status (documented in `trigger --help` and docs/cli.md): 0 no task failed,
    1 ended with failed tasks or refused items, 2 usage error, 3 cancelled, 4 still running."""
    from cli import procs, runs
    from cli.tables import empty_warning

    if a.seeds is not None and a.seeds_file is not None:
        raise UserError("give the seeds as an argument or with --seeds-file, not both")
    seeds = _seeds_file(a.seeds_file) if a.seeds_file is not None else _seeds(a.seeds)
    s = procs.settings()
    procs.ensure_redis(s)
    result = runs.trigger(a.chain, seeds, a.priority, not a.no_wait, a.timeout, a.wait_for_workers)
    if a.no_wait:
        return 0
    p: Any = result  # a Progress once watched
    if p.ending == "cancelled":
        print(f"run {p.run_id} was cancelled", file=sys.stderr)
        return 3
    if p.ending is None:
        print(
            f"run {p.run_id} still running after {a.timeout}s (it goes on; "
            f"./control.sh runs {p.run_id})",
            file=sys.stderr,
        )
        return 4
    if p.ending == "failed":
        refused = p.totals.get("store_failed", 0)
        what = [f"{p.failed} failed task(s)"] if p.failed else []
        what += [f"{refused} item(s) refused by a sink"] if refused else []
        print(
            f"run {p.run_id} ended with {' and '.join(what)}: "
            f"./control.sh deadletter list --run {p.run_id}",
            file=sys.stderr,
        )
        return 1
    print(_complete(p.run_id, p.totals))
    if warn := empty_warning(p.as_dict()):
        print(warn, file=sys.stderr)
    return 0


def _complete(run_id: str, totals: dict[str, int]) -> str:
    """The summary of a run that ended without failures: no success is claimed for tasks
    robots.txt skipped (`skipped`), least of all when they were all the run had."""
    ok, robots = totals.get("succeeded", 0), totals.get("skipped", 0)
    if not robots:
        return f"run {run_id} complete: every task succeeded"
    skipped = f"{robots} task{'s' if robots != 1 else ''} skipped (robots.txt)"
    if not ok:
        return f"run {run_id} complete: no task succeeded, {skipped}"
    return f"run {run_id} complete: {ok} task{'s' if ok != 1 else ''} succeeded, {skipped}"


def cmd_cancel(a: argparse.Namespace) -> None:
    import chains
    from broker.workers import TaskSets
    from cli import procs
    from utils.redis import get_redis

    procs.ensure_redis(procs.settings())
    out = chains.cancel(a.run_id, a.reason or "")
    up = out.outstanding == 0 or bool(TaskSets(get_redis()).live())
    print(cancel_line(a.run_id, out.was, out.dropped, out.outstanding, up))


def cancel_line(run_id: str, was: str, dropped: int, outstanding: int, workers_up: bool) -> str:
    """What `cancel` did; with tasks left and no live worker, why the run stays `cancelling`
    (nothing takes its messages from the broker to skip them)."""
    if was in ("done", "cancelled"):
        return f"run {run_id} had already ended ({was}): nothing to cancel"
    line = (
        f"run {run_id} cancelled: {dropped} waiting task(s) dropped; "
        f"{outstanding} in the broker or running will be skipped as they come up "
        "(items already stored stay)"
    )
    if not workers_up:
        line += (
            "; no worker is up, so they wait in the broker and the run shows cancelling until "
            "one starts and skips them (./control.sh start)"
        )
    return line


def cmd_runs(a: argparse.Namespace) -> None:
    from cli import procs, runs

    procs.require_redis(procs.settings())  # read-only: never starts the embedded Redis
    runs.show(a.run_id, a.limit, a.json, a.chain, a.status)


def _run_targets(a: argparse.Namespace) -> list[str]:
    """RUN_ID, or with --chain / --all the active runs of that chain / every active run."""
    from ledger.state import RunState
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
            print(
                f"run {rid} paused: tasks running now finish; the rest wait until "
                f"./control.sh resume {rid}"
            )


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
    from cli import deadletter, procs

    procs.require_redis(procs.settings())  # never starts the embedded Redis
    if a.action == "list":
        deadletter.list_view(a.limit, a.task, a.verbose, a.run)
    elif a.action == "replay":
        print(f"replayed {deadletter.replay(a.ids, a.all, a.task, a.run)} task(s)")
    else:
        print(f"purged {deadletter.purge(a.ids, a.all, a.task, a.run)} dead letter(s)")


def cmd_chains(a: argparse.Namespace) -> None:
    import chains

    for name in chains.names():
        ch = chains.get_chain(name)
        print(f"{name}: " + " | ".join(f"{sid}={st.task}" for sid, st in ch.steps.items()))


def cmd_config(a: argparse.Namespace) -> None:
    """The CHAINCRAWL_* variables set (names only: values may be secrets), and any that
    nothing reads; `--list`: every variable chaincrawl reads, with its default."""
    if a.list:
        from settings import reference

        print(reference.markdown())
        return
    import sites
    from cli import checks
    from external_interface.resources.pool import known_kinds
    from settings import envcheck

    names = envcheck.set_names()
    print(f"{len(names)} CHAINCRAWL_* variable(s) set" + (": " + ", ".join(names) if names else ""))
    problems = envcheck.current(sites.sites(), known_kinds())
    for p in problems:
        print(f"  {p}")
    values = checks.value_problems()
    for p in values:
        print(f"  {p}")
    if problems or values:
        said = [f"{len(problems)} variable(s) that nothing reads (misspelled?)"] if problems else []
        said += [f"{len(values)} value(s) the workers cannot use"] if values else []
        raise UserError("; ".join(said))
    if names:
        print("each is read by chaincrawl")


def cmd_redis(a: argparse.Namespace) -> None:
    from cli import procs

    s = procs.settings()
    if a.action == "start":
        print(f"redis: {procs.ensure_redis(s)} at {s.redis_url.split('@')[-1]}")
    else:
        print("stopped" if procs.stop_redis(s) else "embedded redis was not running")


def handler(name: str | Callable[[argparse.Namespace], Any]) -> Callable[[argparse.Namespace], Any]:
    """A command's function from its name in cli.parser ("module:function", or a function here);
    modules that import only the standard library (cli.ops, cli.monitoring) give the function."""
    if callable(name):
        return name
    if ":" not in name:
        return globals()[name]
    module, func = name.split(":")
    return getattr(importlib.import_module(module), func)


def _redis_where() -> str:
    from config import get_settings
    from utils.redis import address

    return address(get_settings().redis_url)


def _redis_url() -> str:
    """REDIS_URL as an error names it: without its password."""
    from config import get_settings
    from utils.logsafe import safe_url

    return safe_url(get_settings().redis_url)


def _patient_redis() -> None:
    """Every Redis call of this command waits out a restart or a load (CHAINCRAWL_REDIS_WAIT),
    saying so on one line, instead of failing with a traceback."""
    from config import get_settings
    from utils.outage import stderr_notify
    from utils.redis import be_patient

    try:
        s = get_settings()
    except Exception:  # invalid settings: the command itself reports them
        return
    be_patient(s.redis_wait, stderr_notify(_redis_where(), s.redis_wait))


def _module_warnings() -> None:
    """A site or chain module that fails at import is one line on stderr, and the command
    goes on with the rest (sites/__init__.py, chains/registry.py)."""
    out = logging.StreamHandler()  # sys.stderr as it is when a line is written
    out.setFormatter(logging.Formatter("warning: %(message)s"))
    out.set_name("chaincrawl-cli-modules")
    for name in ("chaincrawl.sites", "chaincrawl.chains"):
        logger = logging.getLogger(name)
        if not any(h.get_name() == out.get_name() for h in logger.handlers):
            logger.addHandler(out)
        logger.propagate = False  # said once, not again by a handler set up later


# commands whose work the settings change: a misspelled variable is named on their stderr,
# not only in a worker's log or by `config`
# (`start` checks once its workers are up, with the sites they loaded: cmd_start)
SETTINGS_CHECKED = frozenset({"trigger", "parse", "shell", "demo"})


def _settings_warnings(site_names: Iterable[str] | None = None) -> None:
    """One `warning:` line per CHAINCRAWL_* variable nothing reads (settings/envcheck.py): a
    typo'd `REQUEST_TIMEOUT` (a letter dropped) would otherwise run with the default unremarked.
    `site_names`: the sites whose per-site variables count (default: the sites imported
    here; `start` gives its workers' and imports none: a site's import is the workers')."""
    import sites
    from external_interface.resources.pool import known_kinds
    from settings import envcheck

    try:
        names = sites.sites() if site_names is None else site_names
        problems = envcheck.current(names, known_kinds())
    except (Exception, SystemExit):  # invalid settings or a site that fails to load: said later
        return
    for problem in problems:
        print(f"warning: {problem} (ignored; ./control.sh config)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        if args.subcommand in SHELL_COMMANDS:
            print(
                f"error: ./control.sh {args.subcommand} (control.sh runs it itself)",
                file=sys.stderr,
            )
            return 2
        rc = run(args)
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head` stopped reading: not an error of ours
        _drop_stdout()
        return 0
    return rc


def run(args: argparse.Namespace) -> int:
    import kombu.exceptions
    import redis

    from exceptions import ChainCrawlError
    from utils.outage import first_line
    from utils.redis import failed_node, not_there, reached
    from utils.slots import SlotsLost

    _patient_redis()
    _module_warnings()
    if args.subcommand in SETTINGS_CHECKED:
        _settings_warnings()
    try:
        rc = handler(args.fn)(args)
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # BusyLoadingError included
        if isinstance(exc, redis.AuthenticationError):
            print(f"error: {_refused_password(exc)}", file=sys.stderr)
        elif not_there(exc) and not reached():
            print(
                f"error: Redis at {_redis_url()} refused the connection (nothing listens "
                "there; REDIS_URL)",
                file=sys.stderr,
            )
        else:
            print(
                f"error: Redis at {failed_node(exc) or _redis_where()} did not answer: "
                f"{first_line(exc)}",
                file=sys.stderr,
            )
        return REDIS_UNREACHABLE
    except SlotsLost as exc:  # a Redis Cluster's slot range no node serves (docs/cluster.md)
        print(f"error: Redis Cluster: {exc}", file=sys.stderr)
        return REDIS_UNREACHABLE
    except kombu.exceptions.OperationalError as exc:  # the broker (Redis or RabbitMQ)
        print(f"error: the broker did not answer: {first_line(exc)}", file=sys.stderr)
        return REDIS_UNREACHABLE
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ChainCrawlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return rc if isinstance(rc, int) else 0


def _refused_password(exc: Exception) -> str:
    """A refused password: for the embedded Redis (REDIS_URL unset), whose it is and what to
    do (another checkout's on the same port, most often); else the URL without its password."""
    from cli import procs
    from utils.outage import first_line

    s = procs.settings()
    if procs.uses_embedded_redis(s):
        return procs.wrong_password(s)
    return f"Redis at {_redis_url()} refused the password: {first_line(exc)}"


def _drop_stdout() -> None:
    """Stdout to /dev/null: the interpreter's last flush at exit must not meet the closed
    pipe again (and print a traceback after all)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def console() -> None:
    """The `chaincrawl` console command (pyproject.toml's [project.scripts])."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
