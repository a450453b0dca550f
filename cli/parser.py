"""Every command's arguments and help: the one source of `./control.sh --help`.

Standard library only, on purpose: `control.sh` runs `python3 -m cli.parser --check ARGS` with
the system Python before anything else, so help, `--version`, a misspelled command or flag and
every other usage error are answered before a venv is made, Redis started or a worker stopped.
A command's handler is named as "module:function" (a bare name: a function of cli/__main__.py)
and imported only when the command runs.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any, NoReturn

from cli import monitoring, ops

ROOT = Path(__file__).resolve().parent.parent

# Copies of values that live in modules needing the venv (a test keeps them equal).
POOLS = ("gevent", "threads", "prefork", "solo")  # config.POOLS, the default first
ITEM_FORMATS = ("jsonl", "csv", "parquet")  # storage.export.FORMATS + storage.columnar.FORMATS
SITE_KINDS = ("list", "detail", "api")
DEMO_FEATURES = "ua_check,sign,device,login,soft_fail"

# Commands control.sh runs itself (no Python handler).
SHELL_COMMANDS = ("setup", "lock", "test", "lint")

TRIGGER_EXIT_CODES = """\
exit status:
  0  the run is complete and no task failed (the summary counts tasks robots.txt skipped)
  1  the run ended with failed tasks (dead letters; `deadletter list --run RUN_ID`)
  2  usage error (a bad argument, unknown chain, unreadable seeds), or live workers
     that lack a task of the chain or consume none of its queues (nothing was sent)
  3  the run was cancelled
  4  still running when --timeout passed (the run goes on)
  5  Redis or the broker unreachable (a refused connection: at once; a Redis restarting or
     loading its data: after CHAINCRAWL_REDIS_WAIT)
  6  the run is paused: a Redis Cluster lost the slots its keys live on (a master and its
     replicas down; the line names them); it resumes by itself once they are served
  130 interrupted (Ctrl-C)"""

# Every other command's exit statuses (`COMMAND --help`): what status 1 means for the
# commands that have one, and whether it talks to Redis (status 5).
_FAILS = {
    "start": "a worker (or the embedded Redis) did not come up; its log's last lines are shown",
    "restart": "a worker did not come up; its log's last lines are shown",
    "flower": "Flower did not come up",
    "demo": "a process did not come up, or the demo run did not complete within --timeout",
    "monitor": "the exporter did not come up",
    "beat": "beat did not come up",
    "parse": "the endpoint raised (its error, or its traceback for a bug in its code)",
    "shell": "the -c code raised",
    "items": "--run: that run stored none of this type (it stored other types)",
    "test": "tests failed (pytest's own statuses)",
    "lint": "a check failed",
}
_NO_REDIS = ("help", "setup", "lock", "test", "lint", "chains", "config", "new-site", "items")
_REDIS_DOWN = (
    "  5  Redis or the broker unreachable (a refused connection: at once; a Redis "
    "restarting\n     or loading its data: after CHAINCRAWL_REDIS_WAIT)"
)
# Commands that only read: they never start the embedded Redis (procs.require_redis).
READ_ONLY = ("status", "runs", "report", "deadletter", "limits")
_REDIS_DOWN_READ_ONLY = (
    "  5  Redis or the broker unreachable (a refused connection, or the embedded Redis "
    "stopped,\n     which this command never starts: at once; a Redis restarting or loading "
    "its data:\n     after CHAINCRAWL_REDIS_WAIT)"
)


def exit_statuses(command: str) -> str:
    """The `exit status:` block of a command's help."""
    lines = ["exit status:", "  0  done"]
    if command in _FAILS:
        lines.append(f"  1  {_FAILS[command]}")
    lines.append("  2  usage error, or bad input or settings (one line: what was wrong)")
    if command not in _NO_REDIS:
        lines.append(_REDIS_DOWN_READ_ONLY if command in READ_ONLY else _REDIS_DOWN)
    lines.append("  130 interrupted (Ctrl-C)")
    return "\n".join(lines)


def version() -> str:
    """The project's version, as pyproject.toml gives it (an installed copy, which has no
    pyproject.toml: its package metadata, made from that file)."""
    try:
        with (ROOT / "pyproject.toml").open("rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except FileNotFoundError:
        return importlib.metadata.version("chaincrawl")


def nearest(word: str, choices: list[str]) -> str | None:
    """The valid choice closest to a misspelled one, if any is close enough: the fewest
    typing slips (a letter added, dropped, changed, or two neighbours swapped: `prase` is one
    slip from `parse`, two from `pause`), ties going to the most similar (difflib's ratio);
    else difflib's own guess."""
    if not choices:
        return None

    def rank(choice: str) -> tuple[int, float]:
        ratio = difflib.SequenceMatcher(None, word.lower(), choice.lower()).ratio()
        return slips(word.lower(), choice.lower()), -ratio

    best = min(choices, key=rank)
    if slips(word.lower(), best.lower()) <= max(1, len(word.lstrip("-")) // 3):
        return best
    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return found[0] if found else None


def slips(a: str, b: str) -> int:
    """Edit distance counting a swap of two neighbouring letters as one edit (optimal string
    alignment): the typos of a hand on a keyboard."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


class Parser(argparse.ArgumentParser):
    """argparse, with "did you mean" added to an invalid choice."""

    def error(self, message: str) -> NoReturn:
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m:
            guess = nearest(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
            if guess:
                message += f" (did you mean '{guess}'?)"
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}\n")


def _start_options(p: argparse.ArgumentParser) -> None:
    """Shared by `start` and `restart`."""
    p.add_argument("--queues", help="comma-separated queues (default: every site + resources)")
    p.add_argument(
        "--pool",
        default=POOLS[0],
        choices=POOLS,
        help=f"{POOLS[0]} (default), " + ", ".join(POOLS[1:]),
    )
    p.add_argument("--concurrency", "-c", type=int, default=16, help="slots per worker (16)")
    p.add_argument(
        "--fetch-slots",
        type=int,
        default=None,
        help="most requests in flight per worker (default: CHAINCRAWL_FETCH_SLOTS, "
        "else one per slot); e.g. -c 20 --fetch-slots 16 keeps 16 requests "
        "going while finished pages parse",
    )
    p.add_argument(
        "--workers",
        "-n",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes on this machine (default: one per core)",
    )
    p.add_argument("--name", default="w", help="worker name prefix (w)")


def _shell_commands(sub: Any) -> None:
    se = sub.add_parser("setup", help="create .venv from the lock files (done automatically)")
    se.add_argument(
        "--browser",
        action="store_true",
        help="add Playwright for rendered pages and check for Chromium",
    )
    se.add_argument(
        "--pycurl",
        action="store_true",
        help="kept for old scripts: pycurl, the default fetcher's, is in the runtime lock",
    )
    sub.add_parser("lock", help="regenerate the lock files (requirements/*.txt) from pyproject")
    te = sub.add_parser("test", help="run the test suite (arguments go to pytest)")
    te.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="PYTEST_ARGS")
    sub.add_parser("lint", help="ruff check, ruff format --check, mypy and the import contracts")
    rs = sub.add_parser(
        "restart",
        help="stop workers (Redis stays), start them with these options, "
        "and bring back the demo site, Flower, beat and the monitor it stopped",
    )
    _start_options(rs)
    rs.set_defaults(fn="cli.restart:cmd_restart")


def _core_commands(sub: Any) -> None:
    st = sub.add_parser("start", help="start workers (and the embedded Redis if needed)")
    _start_options(st)
    st.set_defaults(fn="cmd_start")

    sp = sub.add_parser("stop", help="warm-stop workers and everything control.sh started")
    sp.add_argument("--timeout", type=float, default=120, help="seconds to let tasks finish")
    sp.add_argument("--keep-redis", action="store_true", help="leave the embedded Redis running")
    sp.set_defaults(fn="cmd_stop")

    ss = sub.add_parser("status", help="workers, queues, runs, dead letters, backlog")
    ss.add_argument("--json", action="store_true", help="machine-readable snapshot")
    ss.add_argument("--watch", action="store_true", help="refresh live until Ctrl-C")
    ss.add_argument("--interval", type=float, default=1.0)
    ss.add_argument(
        "--inspect-timeout", type=float, default=1.0, help="seconds to wait for workers to answer"
    )
    ss.add_argument("--no-workers", action="store_true", help="skip asking the workers")
    ss.set_defaults(fn="cmd_status")

    sub.add_parser("flower", help="start Flower (basic auth on)").set_defaults(fn="cmd_flower")

    tr = sub.add_parser(
        "trigger",
        help="start a chain run and show its live progress",
        epilog=TRIGGER_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tr.add_argument("chain")
    tr.add_argument("seeds", nargs="?", help="JSON object or list of objects (root parameters)")
    tr.add_argument(
        "--seeds-file",
        metavar="FILE",
        help="the seeds from a file instead: a JSON list, or one JSON object per "
        "line; '-' reads standard input",
    )
    tr.add_argument("--priority", type=int, help="0..9, 9 most urgent")
    tr.add_argument("--no-wait", action="store_true", help="print the run id and return")
    tr.add_argument(
        "--wait-for-workers",
        action="store_true",
        help="send even when no live worker consumes a queue of the chain (its "
        "tasks wait for one); without it such a trigger is refused, exit 2",
    )
    tr.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="stop watching after this many seconds (exit 4; the run goes on)",
    )
    tr.set_defaults(fn="cmd_trigger")

    ru = sub.add_parser("runs", help="the newest runs (finished too), or one run's steps")
    ru.add_argument("run_id", nargs="?")
    ru.add_argument("--limit", type=int, default=20)
    ru.add_argument("--json", action="store_true")
    ru.add_argument("--chain", help="only this chain's runs")
    ru.add_argument(
        "--status", choices=["running", "paused", "cancelling", "storing", "done", "cancelled"]
    )
    ru.set_defaults(fn="cmd_runs")

    rp = sub.add_parser("report", help="how the crawls went, as one self-contained HTML file")
    rp.add_argument("run_id", nargs="?", help="one run (default: the runs of the last 24 h)")
    rp.add_argument("--site", help="only the runs of this site's chains")
    rp.add_argument("--since", help="the runs started within this long: 90m, 24h (default), 7d")
    rp.add_argument("--out", "-o", default="report.html", help="the file to write (report.html)")
    rp.set_defaults(fn="cli.report:main")

    for name, what, reason in (
        ("cancel", "stop a run (workers and other runs go on)", "kept with the run"),
        (
            "pause",
            "hold a run without losing its place (resume goes on)",
            "kept with the run while it is paused",
        ),
        ("resume", "let a paused run go on", ""),
    ):
        rc = sub.add_parser(name, help=what)
        if name == "cancel":  # one run at a time: cancelling is not undone
            rc.add_argument("run_id")
        else:  # a site under maintenance, a proxy provider down: hold a chain's runs, or all
            rc.add_argument("run_id", nargs="?")
            rc.add_argument("--chain", help="every active run of this chain")
            rc.add_argument("--all", action="store_true", help="every active run")
        if reason:
            rc.add_argument("--reason", help=reason)
        rc.set_defaults(fn=f"cmd_{name}", cmd=name)

    dl = sub.add_parser(
        "deadletter",
        help="list, replay or purge tasks that failed for good",
        description="list: the dead letters (newest first); replay: send them "
        "again with fresh retries, reopening their runs; purge: delete them. "
        "replay and purge need ids or a selector (--run, --task, --all).",
    )
    dl.add_argument("action", choices=["list", "replay", "purge"])
    dl.add_argument("ids", nargs="*", help="dead-letter ids (from `deadletter list`)")
    dl.add_argument("--all", action="store_true", help="every dead letter")
    dl.add_argument("--task", help="only this task name")
    dl.add_argument("--run", help="only this run's tasks")
    dl.add_argument("--limit", type=int, default=50, help="list at most this many (50)")
    dl.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="show tracebacks, and where failed renders left their screenshot and DOM",
    )
    dl.set_defaults(fn="cmd_deadletter")

    sub.add_parser("chains", help="list the defined chains").set_defaults(fn="cmd_chains")

    cf = sub.add_parser("config", help="check the CHAINCRAWL_* variables for misspellings")
    cf.add_argument("--list", action="store_true", help="every variable, default and meaning")
    cf.set_defaults(fn="cmd_config")

    rd = sub.add_parser("redis", help="start/stop the embedded Redis")
    rd.add_argument("action", choices=["start", "stop"])
    rd.set_defaults(fn="cmd_redis")


def _tool_commands(sub: Any) -> None:
    p = sub.add_parser("demo", help="the demo crawl on the embedded defaults")
    p.add_argument("--size", default="small", help="demo site size: tiny, small, medium, large")
    p.add_argument(
        "--chain",
        default="demo_social",
        help="chain to run (demo_social; demo_js renders its list in a browser)",
    )
    p.add_argument(
        "--features",
        default=DEMO_FEATURES,
        help=f"demo anti-crawl features ({DEMO_FEATURES}); '' for none",
    )
    p.add_argument("--soft-fail-rate", type=float, default=0.02)
    p.add_argument("--latency-ms", type=float, default=20.0, help="demo site latency per response")
    p.add_argument("--port", type=int, default=8700, help="demo site port (8700)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--pool", default=POOLS[0], choices=POOLS, help=f"worker pool ({POOLS[0]})")
    p.add_argument("--priority", type=int, default=None)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--no-flower", action="store_true")
    p.set_defaults(fn="cli.demo:cmd_demo")

    p = sub.add_parser(
        "items", help="stored items of a type (JSON lines, CSV, Parquet), their history, a search"
    )
    p.add_argument("type", nargs="?", help="item type, e.g. demo.post (none: list the types)")
    p.add_argument(
        "--format",
        "-f",
        default=None,
        choices=ITEM_FORMATS,
        help="jsonl, csv, or parquet (a dataset partitioned by day: --out DIR); "
        "default: what --out's extension says (.jsonl, .ndjson, .csv, .parquet), "
        "JSON lines on stdout",
    )
    p.add_argument("--run", help="only the items this run stored")
    p.add_argument(
        "--out", "-o", help="write to this file (parquet: this directory) instead of stdout"
    )
    p.add_argument(
        "--key",
        "-k",
        action="append",
        help="with --history: the item's key value (once per key field, in order)",
    )
    p.add_argument(
        "--history",
        action="store_true",
        help="the versions of the item's history fields, with when each held",
    )
    p.add_argument(
        "--search",
        metavar="WORDS",
        help='items whose search fields match (postgres): words, "a phrase", -word',
    )
    p.add_argument(
        "--from",
        dest="sink",
        metavar="SINK",
        help="the sink to read --history or --search from (default: the type's first "
        "sink that keeps history; postgres for --search)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="every stored version (append mode keeps them), not the latest per key",
    )
    p.add_argument("--limit", type=int, help="at most this many items")
    p.set_defaults(fn="cli.items:main")

    p = sub.add_parser(
        "new-site", help="generate an endpoint module, its item type and a parser test"
    )
    p.add_argument("site")
    p.add_argument("platform", help="e.g. pc, h5, app, common")
    p.add_argument("endpoint", help="e.g. user_info")
    p.add_argument(
        "--kind",
        choices=SITE_KINDS,
        default="list",
        help="list (an HTML list with a next page, default), detail (one HTML page "
        "about one thing) or api (a JSON list with a next page)",
    )
    p.add_argument(
        "--item",
        help="the item type's name (default: the endpoint's); several endpoints may yield one type",
    )
    p.add_argument(
        "--base-url",
        default="",
        help="where the site lives (written as its default; CHAINCRAWL_BASE_URL_<SITE> "
        "overrides it)",
    )
    p.set_defaults(fn="cli.newsite:main")

    p = sub.add_parser("shell", help="fetch a page and try selectors on it interactively")
    p.add_argument("url")
    p.add_argument("--site", help="send it as the site's endpoints do (SITE or SITE.PLATFORM)")
    p.add_argument("--task", help="send it as this endpoint does")
    p.add_argument("-c", "--command", help="run this Python code in the session, then exit")
    p.set_defaults(fn="cli.shell:main")

    p = sub.add_parser("parse", help="run one endpoint once, live, and print what it yields")
    p.add_argument("task", help="endpoint task name, e.g. demo.pc.feed")
    p.add_argument("params", nargs="?", help="its parameters as a JSON object (default {})")
    p.add_argument("--chain", help="also show the children this chain's step would dispatch")
    p.add_argument("--step", help="the chain's step that runs TASK (when several do)")
    p.add_argument(
        "--save-fixture",
        action="store_true",
        help="record the answers for the endpoint's parser test",
    )
    p.add_argument(
        "--fixture-dir",
        help="where to record them (default: tests/sites/<site>/<platform>/fixtures/<endpoint>/)",
    )
    p.set_defaults(fn="cli.parse:main")

    ops.register(sub)
    monitoring.register(sub)


def build_parser() -> Parser:
    p = Parser(
        prog="control.sh",
        description="chaincrawl: start workers, trigger chains, "
        "watch runs. Every command sets the project up first if needed (.venv).",
        epilog="./control.sh COMMAND --help: that command's options",
    )
    p.add_argument("--version", action="version", version=f"chaincrawl {version()}")
    # "subcommand", not "command": `shell -c/--command CODE` has that name
    sub = p.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    hp = sub.add_parser("help", help="this help, or one command's (help COMMAND)")
    hp.add_argument("topic", nargs="?", metavar="COMMAND")
    _shell_commands(sub)
    _core_commands(sub)
    _tool_commands(sub)
    for name, cmd in _commands(p).items():
        if cmd.epilog is None:
            cmd.epilog = exit_statuses(name)
            cmd.formatter_class = argparse.RawDescriptionHelpFormatter
    return p


def _commands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(p: argparse.ArgumentParser) -> list[str]:
    return [s for a in p._actions for s in a.option_strings if s.startswith("--")]


def _fail(p: argparse.ArgumentParser, message: str) -> NoReturn:
    p.print_usage(sys.stderr)
    p.exit(2, f"error: {message}\n")


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line as a namespace; help, --version and usage errors exit (0 or 2).

    An unknown command or flag is named with the nearest valid one, under the usage of the
    command it belongs to (argparse alone would show the top-level usage)."""
    p = build_parser()
    commands = _commands(p)
    if not argv:
        p.print_help()
        p.exit(0)
    first = argv[0]
    if first.startswith("-") and first not in ("-h", "--help", "--version"):
        guess = nearest(first, ["--help", "--version"])
        _fail(p, f"unrecognized argument {first}" + (f" (did you mean {guess}?)" if guess else ""))
    if not first.startswith("-") and first not in commands:
        guess = nearest(first, list(commands))
        if guess:
            _fail(commands[guess], f"unknown command '{first}' (did you mean '{guess}'?)")
        _fail(p, f"unknown command '{first}' (./control.sh --help lists them)")
    a, extra = p.parse_known_args(argv)
    cmd = commands[a.subcommand]
    if a.subcommand == "help":
        target = commands.get(a.topic or "")
        if a.topic and target is None:
            guess = nearest(a.topic, list(commands))
            _fail(
                p, f"unknown command '{a.topic}'" + (f" (did you mean '{guess}'?)" if guess else "")
            )
        (target or p).print_help()
        p.exit(0)
    if extra and a.subcommand != "test":  # pytest's own flags pass through
        bad = extra[0]
        guess = nearest(bad.split("=")[0], _options(cmd)) if bad.startswith("-") else None
        _fail(cmd, f"unrecognized argument {bad}" + (f" (did you mean {guess}?)" if guess else ""))
    return a


def main(argv: list[str] | None = None) -> int:
    """`python3 -m cli.parser --check ARGS`, control.sh's first step: exit status 0 when the
    command line is valid (nothing printed), 3 when help or the version was printed (nothing
    more to do), 2 after a usage error."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--check"]:
        args = args[1:]
    try:
        parse(args)
        sys.stdout.flush()
    except SystemExit as exc:
        return 3 if exc.code in (0, None) else int(exc.code or 2)
    except BrokenPipeError:  # `--help | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
