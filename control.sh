#!/usr/bin/env bash
# chaincrawl's one command line. Every command sets the project up first if needed.
#   ./control.sh demo                 the demo crawl on the embedded defaults
#   ./control.sh test [pytest args]   the quick test suite, 3 wide (-m extended: the rest; docs/testing.md)
#   ./control.sh --help               every command (the help comes from cli/parser.py)
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

VENV=.venv
PY=${PYTHON:-python3}

# The lock files decide what is installed (requirements/*.txt, made by `./control.sh lock` from
# pyproject.toml's ranges): the same versions on every machine, every time.
LOCK=requirements/dev.txt          # runtime + demo + test: what this checkout needs
BROWSER_LOCK=requirements/browser.txt
PYCURL_LOCK=requirements/pycurl.txt  # `setup --pycurl` of old scripts: pycurl is in LOCK now

# sha1 of the lock files (coreutils' sha1sum, else Python: the same digest): no interpreter
# start on every command where sha1sum is there
deps_stamp() {
  if command -v sha1sum >/dev/null; then cat "$@" | sha1sum | cut -c1-12; return; fi
  "$PY" - "$@" <<'PYX'
import hashlib, pathlib, sys
print(hashlib.sha1(b"".join(pathlib.Path(f).read_bytes() for f in sys.argv[1:])).hexdigest()[:12])
PYX
}

need_python() {
  if ! command -v "$PY" >/dev/null; then echo "error: $PY not found; install Python 3.11+" >&2; exit 2; fi
  "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
    || { echo "error: Python 3.11+ needed, found $("$PY" --version)" >&2; exit 2; }
}

setup() {
  need_python
  local locks=("$LOCK"); [[ -f $VENV/.with-browser ]] && locks+=("$BROWSER_LOCK")
  [[ -f $VENV/.with-pycurl ]] && locks+=("$PYCURL_LOCK")
  local stamp; stamp=$(deps_stamp "${locks[@]}")
  if [[ -x $VENV/bin/python && -f $VENV/.deps-$stamp ]]; then return 0; fi
  echo "setting up $VENV from ${locks[*]} (first run or dependencies changed)..." >&2
  [[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  local lock; for lock in "${locks[@]}"; do
    "$VENV/bin/python" -m pip install -q -r "$lock" >&2
  done
  rm -f "$VENV"/.deps-*
  touch "$VENV/.deps-$stamp"
}

# `./control.sh lock`: the lock files again from pyproject.toml's ranges (uv pip compile,
# marker-aware so one file serves every platform); review the diff, then commit it.
lock() {
  setup
  local spec name extras
  for spec in "runtime:" "dev:--extra demo --extra test" \
      "bench:--extra demo --extra test --extra bench" "browser:--extra browser" "kafka:--extra kafka" \
      "postgres:--extra postgres" "parquet:--extra parquet" "pycurl:--extra pycurl"; do
    name=${spec%%:*}; extras=${spec#*:}
    # shellcheck disable=SC2086
    "$VENV/bin/uv" pip compile pyproject.toml $extras --universal --python-version 3.11 -q \
      -o "requirements/$name.txt" || exit 1
  done
  # Crawlee, the benchmark's peer, lives in a venv of its own (bench/crawlee_env.py)
  "$VENV/bin/uv" pip compile requirements/bench-crawlee.in --universal --python-version 3.11 -q \
    -o requirements/bench-crawlee.txt || exit 1
  echo "locked: requirements/*.txt"
}

# Rendered pages need Playwright (the `browser` extra, remembered for later setups) and a
# Chromium from the system's packages; the check says exactly what is missing (exit 1).
setup_browser() {
  touch "$VENV/.with-browser" 2>/dev/null || { setup; touch "$VENV/.with-browser"; }
  setup
  "$VENV/bin/python" -m external_interface.browser
}

# `./control.sh test`: the quick run goes 3 wide (pytest-xdist; each pytest worker has its own
# Redis, sites and temporary directories): its tests mostly wait on their servers and workers,
# so 3 at a time share 2 cores. One at a time, as given: a run choosing a mark (`-m extended`,
# `-m slow`: long tests that kill servers, time crawls or measure the machine), naming tests
# (`::`), choosing its own width (`-n 4`, `-n 0`, `-p no:xdist`) or a debugger; and a run of
# sites' parser tests alone (every path under tests/sites/): offline replays that take a
# second, where starting three pytest workers took ten.
test_width() {
  local a paths=0 sites=0
  for a in "$@"; do
    case $a in
      -m | -m* | --markexpr* | -n | -n* | --numprocesses* | no:xdist | --pdb | --trace | *::*) return ;;
      -*) ;;
      *) paths=$((paths + 1)); case ${a#./} in tests/sites | tests/sites/*) sites=$((sites + 1)) ;; esac ;;
    esac
  done
  if ((paths > 0 && paths == sites)); then return; fi
  echo "-n 3"
}

# The command line is checked first, by the system Python and the standard library alone
# (cli/parser.py): help, --version and usage errors are answered before a venv is made, Redis
# started or a worker stopped. Its exit status: 0 valid, 3 help or version printed, 2 usage error,
# 9 a Python older than 3.11 (checked in the same start: one interpreter start, not two).
# On a warm checkout the venv's interpreter does it: a binary, where `python3` may be a
# version manager's shim (pyenv's costs about 0.2 s a start).
CHECK_PY=$PY; [[ -x $VENV/bin/python ]] && CHECK_PY=$VENV/bin/python
if ! command -v "$CHECK_PY" >/dev/null; then echo "error: $PY not found; install Python 3.11+" >&2; exit 2; fi
rc=0; "$CHECK_PY" -c 'import sys
if sys.version_info < (3, 11): sys.exit(9)
from cli.parser import main; sys.exit(main())' --check "$@" || rc=$?
case $rc in
  0) ;;
  3) exit 0 ;;
  9) echo "error: Python 3.11+ needed, found $("$PY" --version)" >&2; exit 2 ;;
  *) exit "$rc" ;;
esac

cmd=$1
case "$cmd" in
  setup)
    shift; PY=${PYTHON:-python3}
    case "${1:-}" in
      "") setup ;;
      --browser) setup_browser ;;
      --pycurl) touch "$VENV/.with-pycurl" 2>/dev/null || { setup; touch "$VENV/.with-pycurl"; }
                setup ;;
    esac
    echo "ready: $VENV" ;;
  lock) shift; lock ;;
  test)
    shift; setup
    # shellcheck disable=SC2046
    exec "$VENV/bin/python" -m pytest $(test_width "$@") "$@" ;;
  lint)
    shift; setup
    "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check . \
      && "$VENV/bin/mypy" && exec "$VENV/bin/python" -m tests.architecture lint --no-cache ;;
  *)
    setup
    exec "$VENV/bin/python" -m cli "$@" ;;
esac
