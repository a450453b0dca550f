#!/usr/bin/env bash
# chaincrawl's one command line. Every command sets the project up first if needed.
#   ./control.sh demo                 the demo crawl on the embedded defaults
#   ./control.sh test [pytest args]   the test suite
#   ./control.sh --help               every command
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

VENV=.venv
PY=${PYTHON:-python3}

usage() {
  cat <<'USAGE'
usage: ./control.sh COMMAND [options]     (./control.sh COMMAND --help for details)

  setup                      create .venv and install the project (done automatically)
  demo [--size S]            the demo crawl: Redis, demo site, workers, Flower, chain, summary
  start [--queues Q] [--pool P] [--concurrency N] [--workers N]
                             start workers (one per core by default, gevent pool)
  stop                       warm-stop workers, Flower, beat, demo site, embedded Redis
  restart                    stop, then start with the same options
  status [--json|--watch]    workers, queue depths, active runs, dead letters, backlog
  flower                     start Flower with basic auth
  monitor                    Prometheus /metrics exporter and alert rules
  beat [--schedule F] [--check|--status|--foreground]
                             periodic chains from schedules.yaml (Celery beat)
  limits [--json]            shared rate limits and concurrency caps, with live usage
  trigger CHAIN [JSON]       start a chain run; prints the run id and live progress
  runs [RUN_ID] [--chain C] [--status S] [--json]
                             the newest runs, finished too, or one run's steps
  cancel RUN_ID [--reason R] stop a run; workers and other runs go on
  pause RUN_ID|--chain C|--all [--reason R]
                             hold runs: running tasks finish, the rest wait in Redis
  resume RUN_ID|--chain C|--all
                             let paused runs go on where they stopped
  deadletter list|replay     tasks that failed for good
  chains                     list the defined chains
  config                     check the CHAINCRAWL_* variables (a misspelled one is reported)
  new-site SITE PLATFORM ENDPOINT
                             generate an endpoint module, schemas and a parser test
  redis start|stop           the embedded Redis (used when REDIS_URL is unset)
  test [pytest args]         run the test suite
USAGE
}

deps_stamp() { "$PY" - <<'PYX'
import hashlib, pathlib
print(hashlib.sha1(pathlib.Path("pyproject.toml").read_bytes()).hexdigest()[:12])
PYX
}

setup() {
  if ! command -v "$PY" >/dev/null; then echo "error: $PY not found; install Python 3.11+" >&2; exit 2; fi
  "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
    || { echo "error: Python 3.11+ needed, found $("$PY" --version)" >&2; exit 2; }
  local stamp; stamp=$(deps_stamp)
  if [[ -x $VENV/bin/python && -f $VENV/.deps-$stamp ]]; then return 0; fi
  echo "setting up $VENV (first run or dependencies changed)..." >&2
  [[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" - <<'PYX' > "$VENV/requirements.txt"
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["test"]))
PYX
  "$VENV/bin/python" -m pip install -q -r "$VENV/requirements.txt" >&2
  rm -f "$VENV"/.deps-*
  touch "$VENV/.deps-$stamp"
}

cmd=${1:-}
case "$cmd" in
  ""|-h|--help|help) usage; exit 0 ;;
  setup) shift; PY=${PYTHON:-python3}; setup; echo "ready: $VENV" ;;
  test)
    shift; setup
    exec "$VENV/bin/python" -m pytest "$@" ;;
  lint)
    shift; setup
    "$VENV/bin/ruff" check . && exec "$VENV/bin/ruff" format --check . ;;
  restart)
    shift; setup
    "$VENV/bin/python" -m cli stop --keep-redis
    exec "$VENV/bin/python" -m cli start "$@" ;;
  *)
    setup
    exec "$VENV/bin/python" -m cli "$@" ;;
esac
