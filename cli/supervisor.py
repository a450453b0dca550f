"""`python -m cli.supervisor --name NAME -- CMD...`: run CMD and start it again when it exits
unexpectedly, as systemd's `Restart=on-failure` would.

`control.sh start` runs every worker under one (cli/procs.py `start_workers`): a worker that
exits by itself (a crash, an "Unrecoverable error" in the broker connection: see "A worker
survives a Redis restart" in docs/reliability.md) is restarted after a back-off (1 s, doubling up to `--max-backoff`, back
to 1 s once it has run for a minute), at most `--max-restarts` times within `--window`
seconds; then the supervisor gives up and exits with the worker's code. Every exit and restart
is logged (to the worker's log: the supervisor shares its stdout).

Not restarted: an exit with code 0 (a warm shutdown asked for by someone, e.g. `celery control
shutdown`). A worker that has never been ready (with `--ready-marker`: one that exits before
this run wrote the marker, " ready." for Celery, to the log; without: one that exits within
`--start-grace` seconds) failed to start: it is started again with the same back-off up to
`--start-attempts` times in all (CHAINCRAWL_WORKER_START_ATTEMPTS), then the supervisor gives
up, so that `control.sh start` fails with the worker's last log lines instead of looping.

SIGTERM/SIGINT to the supervisor (what `control.sh stop` sends to the pid file's pid) are
passed on to the worker (warm shutdown); the supervisor waits for it and exits without
restarting. If the supervisor itself is killed, the kernel kills the worker too (Linux
`PR_SET_PDEATHSIG`), so no worker is ever left unsupervised behind a stale pid file.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Supervisor:
    """Keeps one child process running; see the module docstring for the policy."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        max_restarts: int = 10,
        window: float = 600.0,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        healthy_after: float = 60.0,
        start_grace: float = 10.0,
        ready_marker: str | None = None,
        start_attempts: int = 3,
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.max_restarts = max_restarts
        self.window = window
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.healthy_after = healthy_after
        self.start_grace = start_grace
        self.ready_marker = ready_marker.encode() if ready_marker else None
        self.start_attempts = max(1, start_attempts)
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts: deque[float] = deque()
        self.stopping = threading.Event()
        self.signal: int | None = None

    def log(self, level: str, msg: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        sys.stdout.write(f"[{stamp}: {level}/supervisor] {self.name}: {msg}\n")
        sys.stdout.flush()

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        self.signal = signum
        self.stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    def start(self) -> subprocess.Popen[bytes]:
        self.proc = subprocess.Popen(
            self.cmd, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        if self.stopping.is_set():  # a stop arrived while we were starting it
            self.on_signal(self.signal or signal.SIGTERM)
        return self.proc

    def _log_size(self) -> int | None:
        """Where the child's output starts in the log (None: stdout is not a regular file)."""
        try:
            sys.stdout.flush()
            st = os.fstat(sys.stdout.fileno())
        except (OSError, ValueError):
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def _became_ready(self, offset: int | None, ran: float) -> bool:
        """Did this run get going (not a start failure)? Only its own output counts: the log
        is appended to across runs and starts, so an earlier run's marker is no sign."""
        if self.ready_marker is None or offset is None:
            return ran >= self.start_grace
        try:
            # a file description of our own: seeking must not move the writers' offset
            with open(f"/proc/self/fd/{sys.stdout.fileno()}", "rb") as f:
                f.seek(offset)
                return self.ready_marker in f.read()
        except OSError:
            return ran >= self.start_grace

    def run(self) -> int:
        delay = self.backoff
        ever_ready = False
        attempts = 0  # starts while the child has never been ready
        while True:
            started = time.monotonic()
            offset = self._log_size()
            proc = self.start()
            attempts += not ever_ready
            self.log("INFO", f"started pid {proc.pid}")
            code = proc.wait()
            ran = time.monotonic() - started
            if self.stopping.is_set():
                self.log("INFO", f"pid {proc.pid} stopped (code {code})")
                return 0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else code
            if code == 0:
                self.log("INFO", f"pid {proc.pid} exited normally; not restarting")
                return 0
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            ever_ready = ever_ready or self._became_ready(offset, ran)
            if not ever_ready:
                if attempts >= self.start_attempts:
                    self.log(
                        "ERROR",
                        f"pid {proc.pid} {how} {ran:.1f}s after it started, "
                        f"before it was ready; {attempts} failed start(s): giving "
                        "up (see the lines above)",
                    )
                    return code if code > 0 else 1
                self.log(
                    "WARNING",
                    f"pid {proc.pid} {how} {ran:.1f}s after it started, "
                    f"before it was ready; starting it again in {delay:.1f}s "
                    f"(start {attempts + 1} of at most "
                    f"{self.start_attempts})",
                )
            else:
                now = time.monotonic()
                while self.restarts and now - self.restarts[0] > self.window:
                    self.restarts.popleft()
                if len(self.restarts) >= self.max_restarts:
                    self.log(
                        "ERROR",
                        f"pid {proc.pid} {how}; {len(self.restarts)} restarts in "
                        f"the last {self.window:.0f}s: giving up",
                    )
                    return code if code > 0 else 1
                if ran >= self.healthy_after:
                    delay = self.backoff
                self.restarts.append(now)
                self.log(
                    "WARNING",
                    f"pid {proc.pid} {how} after {ran:.1f}s; restarting in "
                    f"{delay:.1f}s (restart {len(self.restarts)} of at most "
                    f"{self.max_restarts} per {self.window:.0f}s)",
                )
            if self.stopping.wait(delay):
                self.log("INFO", "stopped while waiting to restart")
                return 0
            delay = min(self.max_backoff, delay * 2)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cli.supervisor", description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True, help="shown in the log lines")
    p.add_argument("--max-restarts", type=int, default=10)
    p.add_argument("--window", type=float, default=600.0, help="seconds (for --max-restarts)")
    p.add_argument("--backoff", type=float, default=1.0, help="first delay before a restart")
    p.add_argument("--max-backoff", type=float, default=60.0)
    p.add_argument(
        "--healthy-after", type=float, default=60.0, help="a run this long resets the back-off"
    )
    p.add_argument(
        "--start-grace",
        type=float,
        default=10.0,
        help="without --ready-marker: a run shorter than this failed to start",
    )
    p.add_argument(
        "--start-attempts",
        type=int,
        default=3,
        help="starts of a child that never got ready before giving up",
    )
    p.add_argument(
        "--ready-marker",
        default=None,
        help="text the child logs once it is up (a run that exits before "
        "it is a start failure); needs stdout to be the log file",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("no command given (-- CMD ...)")
    sup = Supervisor(
        a.name,
        cmd,
        max_restarts=a.max_restarts,
        window=a.window,
        backoff=a.backoff,
        max_backoff=a.max_backoff,
        healthy_after=a.healthy_after,
        start_grace=a.start_grace,
        ready_marker=a.ready_marker,
        start_attempts=a.start_attempts,
    )
    signal.signal(signal.SIGTERM, sup.on_signal)
    signal.signal(signal.SIGINT, sup.on_signal)
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
