"""Background processes we start and stop: embedded Redis, workers, Flower, beat, demo site.

Each runs in its own session with a pid file under `var/run/` and a log under `var/log/`, so
`control.sh stop` finds exactly what `control.sh` started, from any shell.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cli import REDIS_UNREACHABLE, StartFailed, UserError
from config import POOLS, ROOT, Settings, get_settings, is_cluster_url
from utils.redis import cluster_client, get_redis
from utils.servers import RedisServer, stop_pidfile
from utils.worker_cmd import READY_MARKER, worker_argv


def run_dir(s: Settings) -> Path:
    d = s.var_dir / "run"
    d.mkdir(parents=True, exist_ok=True)
    return d


def log_dir(s: Settings) -> Path:
    d = s.var_dir / "log"
    d.mkdir(parents=True, exist_ok=True)
    return d


def alive(pidfile: Path) -> int | None:
    """The pid in `pidfile` if that process runs. One we started ourselves and that exited
    is reaped here: until then it is a zombie, which `kill(pid, 0)` takes for alive."""
    try:
        pid = int(pidfile.read_text().strip())
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return None
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def start_bg(
    name: str, cmd: list[str], s: Settings, env: dict[str, str] | None = None, umask: int = -1
) -> int:
    """Start `cmd` detached, logging to var/log/<name>.log; returns its pid."""
    pidfile = run_dir(s) / f"{name}.pid"
    if (pid := alive(pidfile)) is not None:
        return pid
    logf = open(log_dir(s) / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=logf,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        umask=umask,
    )
    pidfile.write_text(str(proc.pid))
    return proc.pid


def stop_named(prefix: str, s: Settings, timeout: float = 60.0) -> list[str]:
    """SIGTERM (warm shutdown for workers) every process whose pid file starts with prefix;
    its pid file and its start's log offset (`.logpos`) go with it."""
    stopped = []
    for pidfile in sorted(run_dir(s).glob(f"{prefix}*.pid")):
        if stop_pidfile(pidfile, signal.SIGTERM, timeout):
            stopped.append(pidfile.stem)
        pidfile.with_suffix(".logpos").unlink(missing_ok=True)
    return stopped


def process_cmd(pid: int) -> list[str]:
    """The command line process `pid` was started with ([] if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def process_env(pid: int) -> dict[str, str]:
    """The environment process `pid` was started with ({} if unreadable): what a running
    worker was told (its `DEMO_BASE_URL`), whatever this shell has now."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (part.decode(errors="replace").partition("=") for part in raw.split(b"\0") if part)
    return {k: v for k, _, v in pairs}


def demo_url_of(cmd: list[str]) -> str | None:
    """The URL of the demo site started with `cmd` (`python -m demo --port N ...`)."""
    if "--port" not in cmd[:-1]:
        return None
    host = cmd[cmd.index("--host") + 1] if "--host" in cmd[:-1] else "127.0.0.1"
    return f"http://{host}:{cmd[cmd.index('--port') + 1]}"


def running(prefix: str, s: Settings) -> dict[str, int]:
    out = {}
    for pidfile in sorted(run_dir(s).glob(f"{prefix}*.pid")):
        pid = alive(pidfile)
        if pid is not None:
            out[pidfile.stem] = pid
    return out


# --- Redis -------------------------------------------------------------------------------


def uses_embedded_redis(s: Settings) -> bool:
    if is_cluster_url(s.redis_url):
        return False
    u = urlparse(s.redis_url)
    return u.hostname in ("127.0.0.1", "localhost") and u.port == s.embedded_redis_port


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def ensure_redis(s: Settings) -> str:
    """Start the embedded Redis when REDIS_URL is not set (with the password from
    var/redis.secret, its files private: utils.servers.RedisServer), and check that an embedded
    Redis already running wants that password; either way, wait until Redis answers (one
    restarting or loading its data: up to CHAINCRAWL_REDIS_WAIT, cli/__main__.py). A cluster
    is only checked to answer (the embedded Redis is never started for it)."""
    if is_cluster_url(s.redis_url):
        try:
            cluster_client(s.redis_url).close()  # it read the slot map from a node
        except (redis.RedisError, redis.exceptions.RedisClusterException, ValueError) as exc:
            raise UserError(f"the Redis Cluster of REDIS_URL is not reachable: {exc}") from None
        return "running"
    u = urlparse(s.redis_url)
    host, port = u.hostname or "127.0.0.1", u.port or 6379
    if port_open(host, port):
        if uses_embedded_redis(s) and not _wants_our_password(s, host, port):
            raise UserError(wrong_password(s))
        how = "running"
    elif not uses_embedded_redis(s):
        how = "running"  # or restarting: the ping below waits for it (REDIS_WAIT)
    elif embedded_redis_state(s) == "restarting":
        _wait_restart(s)
        how = "running"
    else:
        start_embedded_redis(s, u.password)
        how = "started"
    get_redis(s.redis_url).ping()  # a Redis loading its append-only file: wait (REDIS_WAIT)
    return how


def wrong_password(s: Settings) -> str:
    """What to do when the Redis on the embedded Redis's port refuses this var/'s password:
    one this var/ started without a password (its pid file is ours) is stopped and started
    again; else it is another checkout's (or another CHAINCRAWL_VAR_DIR's), on the same
    default port, and this one needs a port of its own."""
    port, secret = s.embedded_redis_port, s.var_dir / "redis.secret"
    ours = any(
        alive(f) is not None
        for f in (s.var_dir / "run" / f"{EMBEDDED}.pid", s.var_dir / "redis" / "redis.pid")
    )
    if ours:
        return (
            f"the embedded Redis on port {port} does not want the password in {secret} "
            "(started without one): `./control.sh redis stop`, then start it again"
        )
    return (
        f"the Redis on port {port} does not want the password in {secret}: it is not this "
        "var/'s embedded Redis (another checkout's, or another CHAINCRAWL_VAR_DIR's, on the "
        "same port); give this one a port of its own (CHAINCRAWL_EMBEDDED_REDIS_PORT, in .env), "
        "or stop that one (`./control.sh redis stop` in its own checkout)"
    )


EMBEDDED = "redis"  # var/run/redis.pid: the embedded Redis's supervisor; var/log/redis.log
REDIS_READY = "Ready to accept connections"  # what redis-server logs once its data is loaded
STOPPED = "the embedded Redis is stopped (start it with ./control.sh start)"


def start_embedded_redis(s: Settings, password: str | None, timeout: float = 30.0) -> int:
    """Start the embedded Redis under `cli.supervisor`, as the workers are: a redis-server
    that dies (a `kill -9`, the OOM killer) is started again on the same port, password and
    data dir, its append-only file replayed, and the supervisor logs one line about it to
    var/log/redis.log. A stop (`redis stop`, `stop`: SIGTERM to the supervisor) is passed on
    and not followed by a restart. -> the supervisor's pid, once Redis answers."""
    server = RedisServer(s.var_dir / "redis", s.embedded_redis_port, password=password)
    pidfile = run_dir(s) / f"{EMBEDDED}.pid"
    supervisor = [sys.executable, "-m", "cli.supervisor", "--name", EMBEDDED, "--max-backoff", "10"]
    ready = ["--ready-marker", REDIS_READY, "--ready-log", str(server.log_path)]
    cmd = [*supervisor, *ready, "--", *server.supervised_command()]
    pid = start_bg(EMBEDDED, cmd, s, umask=0o077)  # its files 0600, as RedisServer's own
    deadline = time.monotonic() + timeout
    # Redis listens before it loads its data, and may exit after (a file it cannot read): up
    # is a server that answers, loading or not; its supervisor tries a few times, then gives up
    while not _answers(server.url):
        if alive(pidfile) is None or time.monotonic() > deadline:
            lines = [
                f"  {line}"
                for f in (server.log_path, log_dir(s) / f"{EMBEDDED}.log")
                if f.exists()
                for line in f.read_text(errors="replace").splitlines()[-8:]
            ]
            raise StartFailed(
                f"the embedded Redis did not start on port {s.embedded_redis_port}; the last "
                f"lines of {server.log_path} and {log_dir(s) / (EMBEDDED + '.log')}:\n"
                + "\n".join(lines)
            )
        time.sleep(0.1)
    return pid


def _answers(url: str) -> bool:
    """One PING, one try: a reply (a `LOADING` one too) means the server is up."""
    try:
        redis.Redis.from_url(url, socket_timeout=5, retry=_ONCE).ping()
    except redis.BusyLoadingError:
        return True
    except redis.RedisError:
        return False
    return True


def unfinished_runs(s: Settings) -> list[str]:
    """The ids of the runs not yet done, for `stop` to name: empty when Redis does not answer
    at once (one PING, one try; nothing is started or waited for) or on a Redis Cluster."""
    if is_cluster_url(s.redis_url) or not _answers(s.redis_url):
        return []
    from ledger.state import RunState

    client = redis.Redis.from_url(s.redis_url, socket_timeout=5, retry=_ONCE)
    try:
        return RunState(client, s).active_runs()
    except redis.RedisError:
        return []


def embedded_redis_state(s: Settings) -> str:
    """The embedded Redis (REDIS_URL unset): "running" when its port answers; "restarting"
    when not but its supervisor runs (between two runs of a redis-server that died) or a
    redis-server of ours does (still starting); "stopped" when nothing runs. Read-only: no
    directory is made, nothing is started."""
    if port_open("127.0.0.1", s.embedded_redis_port):
        return "running"
    for pidfile in (s.var_dir / "run" / f"{EMBEDDED}.pid", s.var_dir / "redis" / "redis.pid"):
        if alive(pidfile) is not None:
            return "restarting"
    return "stopped"


def require_redis(s: Settings) -> None:
    """For a command that only reads (`status`, `runs`, `report`, `deadletter list`, ...): the
    embedded Redis is never started by it (an operator who stopped it meant it). Stopped: one
    line at once (no CHAINCRAWL_REDIS_WAIT for a restart that is not coming), exit 5. Restarting under its supervisor: wait for it (CHAINCRAWL_REDIS_WAIT). A Redis
    of REDIS_URL: the command's own calls wait for it or fail (exit 5)."""
    if not uses_embedded_redis(s):
        return
    state = embedded_redis_state(s)
    if state == "stopped":
        raise UserError(STOPPED, exit_code=REDIS_UNREACHABLE)
    if state == "restarting":
        _wait_restart(s)


def _wait_restart(s: Settings) -> None:
    """The embedded Redis's supervisor is starting it again: wait (one line) until it
    listens, up to CHAINCRAWL_REDIS_WAIT; its loading the data is waited for by the client."""
    print(
        f"the embedded Redis is restarting, waiting… (up to {s.redis_wait:.0f}s: "
        "CHAINCRAWL_REDIS_WAIT)",
        file=sys.stderr,
    )
    deadline = time.monotonic() + s.redis_wait
    while (state := embedded_redis_state(s)) == "restarting":
        if time.monotonic() > deadline:
            raise UserError(
                f"the embedded Redis did not come back within {s.redis_wait:.0f}s "
                f"(see {s.var_dir / 'log' / (EMBEDDED + '.log')})",
                exit_code=REDIS_UNREACHABLE,
            )
        time.sleep(0.2)
    if state == "stopped":  # its supervisor gave up
        raise UserError(
            f"the embedded Redis stopped: its supervisor gave up (see "
            f"{s.var_dir / 'log' / (EMBEDDED + '.log')}; ./control.sh start starts it again)",
            exit_code=REDIS_UNREACHABLE,
        )


_ONCE = Retry(NoBackoff(), 0)  # a probe's one try


def _wants_our_password(s: Settings, host: str, port: int) -> bool:
    """Whether the Redis there refuses a client without a password and takes ours (a Redis
    busy loading counts as yes: the command's own calls wait or say so). One connection per
    probe: redis-py would retry the refusal (an `AuthenticationError` is a `ConnectionError`
    to it), seconds of back-off for an answer that is already final."""
    try:
        redis.Redis(host=host, port=port, socket_timeout=5, retry=_ONCE).ping()
        return False  # open to anyone
    except redis.AuthenticationError:
        pass
    except redis.RedisError:
        return True
    try:
        redis.Redis.from_url(s.redis_url, socket_timeout=5, retry=_ONCE).ping()
    except (redis.AuthenticationError, redis.ResponseError):
        return False
    except redis.RedisError:
        pass
    return True


def stop_redis(s: Settings) -> bool:
    """Stop the embedded Redis: its supervisor passes the SIGTERM on (Redis flushes its
    append-only file and exits) and does not restart it; then any redis-server of ours
    running unsupervised (started by an older chaincrawl, or on its own)."""
    if not uses_embedded_redis(s):
        return False
    supervised = bool(stop_named(EMBEDDED, s, 40))
    return stop_pidfile(s.var_dir / "redis" / "redis.pid", signal.SIGTERM, 30) or supervised


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
        cmd = worker_argv(
            app="worker",
            pool=pool,
            concurrency=concurrency,
            queues=queues,
            node=f"{name}{i}@%h",
            events=s.task_events,  # Flower's task list; off by default (CHAINCRAWL_TASK_EVENTS)
        )
        if supervise:
            cmd = [
                sys.executable,
                "-m",
                "cli.supervisor",
                "--name",
                wname,
                "--ready-marker",
                READY_MARKER,
                "--start-attempts",
                str(s.worker_start_attempts),
                "--",
                *cmd,
            ]
        if alive(run_dir(s) / f"{wname}.pid") is None:  # this start's output begins here
            logf = log_dir(s) / f"{wname}.log"
            (run_dir(s) / f"{wname}.logpos").write_text(
                str(logf.stat().st_size if logf.exists() else 0)
            )
        start_bg(wname, cmd, s, env)
        started.append(wname)
    return started


def _this_start(name: str, s: Settings) -> bytes:
    """What worker `name` logged since `control.sh` last started it (its log is appended to
    across starts: an earlier start's " ready." must not count)."""
    logf = log_dir(s) / f"{name}.log"
    try:
        pos = int((run_dir(s) / f"{name}.logpos").read_text().strip())
    except (OSError, ValueError):
        pos = 0
    try:
        with open(logf, "rb") as f:
            f.seek(pos)
            return f.read()
    except OSError:
        return b""


def wait_workers_ready(names: list[str], s: Settings, timeout: float | None = None) -> None:
    """Wait until every worker has logged " ready." in this start. A worker that dies first is
    started again by its supervisor (CHAINCRAWL_WORKER_START_ATTEMPTS in all); once the
    supervisor gives up: `StartFailed` with the worker's last log lines."""
    if timeout is None:  # a start may take a while on a busy machine, and may be tried again
        timeout = 60.0 * s.worker_start_attempts
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        for n in sorted(pending):
            if READY_MARKER.encode() in _this_start(n, s):
                pending.discard(n)
            elif alive(run_dir(s) / f"{n}.pid") is None:
                lines = _this_start(n, s).decode(errors="replace").splitlines()
                tail = "\n".join("  " + line for line in lines[-25:])
                raise StartFailed(
                    f"{n} did not start (tried {s.worker_start_attempts} time(s), "
                    f"CHAINCRAWL_WORKER_START_ATTEMPTS); the last lines of "
                    f"{log_dir(s) / (n + '.log')}:\n{tail}"
                )
        time.sleep(0.2)
    if pending:
        raise StartFailed(
            f"workers not ready after {timeout:.0f}s: {', '.join(sorted(pending))} "
            f"(see {log_dir(s)})"
        )


def answering_workers(names: list[str], timeout: float = 2.0, tries: int = 3) -> list[str]:
    """Which of our workers (pid file names: worker-w1 is node w1@host) answer a ping: the
    workers actually running, not the number asked for (a busy worker gets a few tries)."""
    from worker import app

    nodes: set[str] = set()
    for _ in range(tries):
        try:
            # `limit`: back as soon as ours all answered, not after the whole timeout
            replies = app.control.ping(timeout=timeout, limit=len(names)) or []
        except Exception:  # the broker is unreachable: none answers
            replies = []
        nodes |= {node.split("@", 1)[0] for reply in replies for node in reply}
        if all(n.removeprefix("worker-") in nodes for n in names):
            break
    return [n for n in names if n.removeprefix("worker-") in nodes]


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
        sys.executable,
        "-m",
        "monitor.flower",  # celery -A worker flower, metrics guarded
        f"--address={s.flower_address}",
        f"--port={s.flower_port}",
        "--persistent=False",
        "--purge_offline_workers=60",
        "--tasks_columns=name,uuid,state,args,received,started,runtime,retries,worker",
    ]
    # the credentials travel in the environment, not on the command line (ps shows argv)
    env = {"FLOWER_BASIC_AUTH": f"{s.flower_user}:{flower_password(s)}"}
    pid = start_bg("flower", cmd, s, env)
    host = s.flower_address if s.flower_address != "0.0.0.0" else "127.0.0.1"
    wait_listening("flower", pid, host, s.flower_port, s, 60)
    if not s.task_events:
        _enable_events()
    return url, str(s.var_dir / "flower.secret") if not s.flower_password else "FLOWER_PASSWORD"


def listens(pid: int, port: int) -> bool | None:
    """Whether process `pid` holds a TCP socket listening on `port` (Linux: /proc/net/tcp and
    tcp6 matched with the process's file descriptors); None where that cannot be read."""
    inodes: set[str] = set()
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(FileNotFoundError):
                for line in Path(table).read_text().splitlines()[1:]:
                    f = line.split()  # sl local_address rem_address st ... uid timeout inode
                    if len(f) > 9 and f[3] == "0A" and int(f[1].rpartition(":")[2], 16) == port:
                        inodes.add(f"socket:[{f[9]}]")
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, ValueError):
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False


def wait_listening(name: str, pid: int, host: str, port: int, s: Settings, timeout: float) -> None:
    """Wait until `name` (pid `pid`, started by start_bg) listens on host:port itself. Another
    process listening there (one that took the port first) is not it: ours then fails to bind
    and exits, and `StartFailed` says so, with the last lines of its log."""
    pidfile = run_dir(s) / f"{name}.pid"
    logf = log_dir(s) / f"{name}.log"
    deadline = time.monotonic() + timeout
    while True:
        exited = alive(pidfile) != pid
        taken = port_open(host, port)
        if taken and not exited and listens(pid, port) is not False:
            return
        if exited or time.monotonic() > deadline:
            lines = logf.read_text(errors="replace").splitlines()[-15:] if logf.exists() else []
            what = (
                "exited before it listened" if exited else f"did not listen within {timeout:.0f}s"
            )
            other = f"; another process listens on {host}:{port}" if taken else ""
            raise StartFailed(
                f"{name} {what} on {host}:{port}{other}; the last lines of {logf}:\n"
                + "\n".join("  " + line for line in lines)
            )
        time.sleep(0.2)


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
