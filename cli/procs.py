"""Background processes we start and stop: embedded Redis, workers, Flower, beat, demo site.

Each runs in its own session with a pid file under `var/run/` and a log under `var/log/`, so
`control.sh stop` finds exactly what `control.sh` started, from any shell.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from cli import UserError
from config import POOLS, ROOT, Settings, get_settings
from utils.servers import RedisServer, stop_pidfile, wait_for_port


def run_dir(s: Settings) -> Path:
    d = s.var_dir / "run"
    d.mkdir(parents=True, exist_ok=True)
    return d


def log_dir(s: Settings) -> Path:
    d = s.var_dir / "log"
    d.mkdir(parents=True, exist_ok=True)
    return d


def alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def start_bg(name: str, cmd: list[str], s: Settings, env: dict[str, str] | None = None) -> int:
    """Start `cmd` detached, logging to var/log/<name>.log; returns its pid."""
    pidfile = run_dir(s) / f"{name}.pid"
    if (pid := alive(pidfile)) is not None:
        return pid
    logf = open(log_dir(s) / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})}, start_new_session=True,
    )  # fmt: skip
    pidfile.write_text(str(proc.pid))
    return proc.pid


def stop_named(prefix: str, s: Settings, timeout: float = 60.0) -> list[str]:
    """SIGTERM (warm shutdown for workers) every process whose pid file starts with prefix."""
    stopped = []
    for pidfile in sorted(run_dir(s).glob(f"{prefix}*.pid")):
        if stop_pidfile(pidfile, signal.SIGTERM, timeout):
            stopped.append(pidfile.stem)
    return stopped


def running(prefix: str, s: Settings) -> dict[str, int]:
    out = {}
    for pidfile in sorted(run_dir(s).glob(f"{prefix}*.pid")):
        pid = alive(pidfile)
        if pid is not None:
            out[pidfile.stem] = pid
    return out


# --- Redis -------------------------------------------------------------------------------


def uses_embedded_redis(s: Settings) -> bool:
    u = urlparse(s.redis_url)
    return u.hostname in ("127.0.0.1", "localhost") and u.port == s.embedded_redis_port


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def ensure_redis(s: Settings) -> str:
    """Start the embedded Redis when REDIS_URL is not set; check reachability either way."""
    u = urlparse(s.redis_url)
    host, port = u.hostname or "127.0.0.1", u.port or 6379
    if port_open(host, port):
        return "running"
    if not uses_embedded_redis(s):
        raise UserError(f"Redis at {host}:{port} (REDIS_URL) is not reachable")
    server = RedisServer(s.var_dir / "redis", port=s.embedded_redis_port, appendonly=True)
    server.data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(server.command(daemonize=True), check=True, cwd=ROOT)
    wait_for_port(s.embedded_redis_port, timeout=20)
    return "started"


def stop_redis(s: Settings) -> bool:
    if not uses_embedded_redis(s):
        return False
    pidfile = s.var_dir / "redis" / "redis.pid"
    return stop_pidfile(pidfile, signal.SIGTERM, 30)


# --- workers and friends -----------------------------------------------------------------


def start_workers(
    s: Settings,
    queues: str,
    pool: str,
    concurrency: int,
    workers: int,
    name: str = "w",
    supervise: bool = True,
    fetch_slots: int | None = None,
) -> list[str]:
    """Start worker processes, each under `cli.supervisor` (restarted when it exits by
    itself, with back-off and a cap; the pid file holds the supervisor's pid, and SIGTERM to
    it is a warm shutdown of the worker) unless `supervise` is False. `fetch_slots` caps each
    worker's requests in flight (CHAINCRAWL_FETCH_SLOTS) below its task slots."""
    if pool not in POOLS:
        raise UserError(f"--pool must be one of {', '.join(POOLS)}, not {pool!r}")
    if concurrency < 1:
        raise UserError(f"--concurrency must be at least 1, not {concurrency}")
    env: dict[str, str] = {}
    if fetch_slots is not None:
        if fetch_slots < 0:
            raise UserError(f"--fetch-slots must be 0 (no cap) or more, not {fetch_slots}")
        env["CHAINCRAWL_FETCH_SLOTS"] = str(fetch_slots)
    started = []
    for i in range(1, workers + 1):
        wname = f"worker-{name}{i}"
        cmd = [
            sys.executable, "-m", "celery", "-A", "worker", "worker",
            "-P", pool, "-c", str(concurrency), "-Q", queues,
            "-n", f"{name}{i}@%h", "-l", "INFO", "--without-gossip",
        ]  # fmt: skip
        if s.task_events:  # Flower's task list; off by default (CHAINCRAWL_TASK_EVENTS)
            cmd.insert(cmd.index("-l"), "-E")
        if supervise:
            cmd = [sys.executable, "-m", "cli.supervisor", "--name", wname,
                   "--ready-marker", " ready.", "--", *cmd]  # fmt: skip
        start_bg(wname, cmd, s, env)
        started.append(wname)
    return started


def wait_workers_ready(names: list[str], s: Settings, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        for n in list(pending):
            logf = log_dir(s) / f"{n}.log"
            if logf.exists() and b" ready." in logf.read_bytes()[-20000:]:
                pending.discard(n)
            elif alive(run_dir(s) / f"{n}.pid") is None:
                tail = logf.read_text(errors="replace")[-1500:] if logf.exists() else ""
                raise UserError(f"{n} exited during start; see {logf}\n{tail}")
        time.sleep(0.2)
    if pending:
        raise UserError(f"workers not ready after {timeout}s: {sorted(pending)} (see var/log/)")


def flower_password(s: Settings) -> str:
    """Configured password, else one generated once and kept in var/flower.secret (0600)."""
    if s.flower_password:
        return s.flower_password
    f = s.var_dir / "flower.secret"
    if not f.exists():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(secrets.token_urlsafe(12))
        f.chmod(0o600)
    return f.read_text().strip()


def start_flower(s: Settings) -> tuple[str, str]:
    url = f"http://{s.flower_address}:{s.flower_port}/"
    cmd = [
        sys.executable, "-m", "celery", "-A", "worker", "flower",
        f"--address={s.flower_address}", f"--port={s.flower_port}",
        "--persistent=False", "--purge_offline_workers=60",
        "--tasks_columns=name,uuid,state,args,received,started,runtime,retries,worker",
    ]  # fmt: skip
    # the credentials travel in the environment, not on the command line (ps shows argv)
    env = {"FLOWER_BASIC_AUTH": f"{s.flower_user}:{flower_password(s)}"}
    start_bg("flower", cmd, s, env)
    wait_for_port(
        s.flower_port, s.flower_address if s.flower_address != "0.0.0.0" else "127.0.0.1", 30
    )
    if not s.task_events:
        _enable_events()
    return url, str(s.var_dir / "flower.secret") if not s.flower_password else "FLOWER_PASSWORD"


def _enable_events() -> None:
    """Task events are off by default (CHAINCRAWL_TASK_EVENTS): switch them on in the running
    workers so Flower's task list fills (`celery control enable_events`). Workers started
    later need CHAINCRAWL_TASK_EVENTS=1."""
    try:
        from worker import app

        app.control.enable_events(timeout=2)
    except Exception:  # no worker running yet, or the broker is busy: Flower still starts
        pass


def settings() -> Settings:
    return get_settings()
