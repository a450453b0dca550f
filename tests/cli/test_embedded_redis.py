"""The embedded Redis `control.sh` starts (cli.procs.ensure_redis) is private: the generated
password from var/redis.secret, refused without it, off its command line, files 0600 in a 0700
dir; one already running without that password is named, not met with a traceback. It runs
under a supervisor (a `kill -9` is followed by a restart with its data), and the commands that
only read never start it."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from cli import StartFailed, UserError, procs
from cli.parser import READ_ONLY
from config import ROOT, Settings
from tests.cli.test_demo_smoke import own_env
from utils.redis import hostport
from utils.servers import RedisServer, free_port, wait_aof_written


def test_ensure_redis_starts_it_with_the_generated_password(tmp_path: Path) -> None:
    s = Settings(var_dir=tmp_path / "var", redis_url="", embedded_redis_port=free_port())
    (tmp_path / "var" / "redis").mkdir(parents=True)
    (tmp_path / "var" / "redis" / "appendonly.aof").write_bytes(b"")  # left readable before
    (tmp_path / "var" / "redis" / "appendonly.aof").chmod(0o644)
    try:
        assert procs.ensure_redis(s) == "started"
        password = (tmp_path / "var" / "redis.secret").read_text().strip()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=s.embedded_redis_port).ping()
        r = redis.Redis.from_url(s.redis_url)
        r.set("k", "v")
        r.save()
        pid = (tmp_path / "var" / "redis" / "redis.pid").read_text().strip()
        supervisor = (tmp_path / "var" / "run" / "redis.pid").read_text().strip()
        for p in (pid, supervisor):
            assert password.encode() not in Path(f"/proc/{p}/cmdline").read_bytes()
        data = tmp_path / "var" / "redis"
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in data.iterdir()}
        assert {"appendonly.aof", "dump.rdb", "redis.log", "redis.pid", "redis.conf"} <= set(modes)
        assert set(modes.values()) == {0o600}, modes
        assert procs.ensure_redis(s) == "running"
    finally:
        procs.stop_redis(s)


def test_an_embedded_redis_running_without_the_password_is_named(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "old") as old:  # started before passwords, say
        s = Settings(var_dir=tmp_path / "var", redis_url="", embedded_redis_port=old.port)
        with pytest.raises(UserError, match=r"does not want the password in .*redis\.secret"):
            procs.ensure_redis(s)
    with RedisServer(tmp_path / "other", password="another") as other:  # another var/'s
        s = Settings(var_dir=tmp_path / "var", redis_url="", embedded_redis_port=other.port)
        with pytest.raises(UserError, match=r"does not want the password.*redis stop") as ei:
            procs.ensure_redis(s)
        # a second checkout on the default port: named as such, with the port setting
        assert "it is not this var/'s embedded Redis (another checkout's" in str(ei.value)
        assert "CHAINCRAWL_EMBEDDED_REDIS_PORT" in str(ei.value)
        # a command that only reads says the same, not 'invalid username-password pair'
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINCRAWL_")}
        env.pop("REDIS_URL", None)
        env.update(CHAINCRAWL_VAR_DIR=str(tmp_path / "var"),
                   CHAINCRAWL_EMBEDDED_REDIS_PORT=str(other.port))  # fmt: skip
        runs = subprocess.run([sys.executable, "-m", "cli", "runs"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert runs.returncode == 5, runs.stdout + runs.stderr
        assert runs.stderr.startswith(f"error: the Redis on port {other.port} does not want")
        assert "username-password" not in runs.stderr


def test_a_cluster_state_store_is_checked_not_started(tmp_path: Path, redis_cluster) -> None:
    """A `redis+cluster://` REDIS_URL is never the embedded Redis: control.sh checks that the
    cluster answers and names it when it does not."""
    broker = "redis://127.0.0.1:1/0"
    s = Settings(var_dir=tmp_path / "var", redis_url=redis_cluster.url, broker_url=broker)
    assert not procs.uses_embedded_redis(s)
    assert hostport(s.redis_url) == ("127.0.0.1", redis_cluster.nodes[0].port)
    assert procs.ensure_redis(s) == "running"
    gone = f"redis+cluster://127.0.0.1:{free_port()}"
    with pytest.raises(UserError, match=r"^the Redis Cluster of REDIS_URL is not reachable"):
        procs.ensure_redis(Settings(var_dir=tmp_path / "var", redis_url=gone, broker_url=broker))


def test_the_password_check_connects_once_per_probe(tmp_path: Path) -> None:
    """A Redis refusing a client without a password answers once and for all: redis-py's
    retries of that refusal (an AuthenticationError is a ConnectionError to it) were seconds
    of back-off on every command that checks the embedded Redis."""
    with RedisServer(tmp_path / "r", password="pw") as server:
        s = Settings(
            var_dir=tmp_path / "var", redis_url=server.url, embedded_redis_port=server.port
        )
        counter = redis.Redis.from_url(server.url)

        def received() -> int:
            return int(counter.info("stats")["total_connections_received"])

        before = received()
        assert procs._wants_our_password(s, "127.0.0.1", server.port)
        assert received() - before == 2  # the probe without the password, the one with it


def wait_for(cond: Callable[[], object], timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout}s: {what}")
        time.sleep(0.1)


def answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=5).ping())
    except redis.RedisError:
        return False


def test_a_killed_embedded_redis_is_started_again_with_its_data(tmp_path: Path) -> None:
    """SIGKILL to the embedded redis-server: its supervisor starts it again on the same port,
    password and data dir, with every write it acknowledged (the append-only file), and logs
    one warning line; a stop (`redis stop`) is not followed by a restart."""
    var = tmp_path / "var"
    s = Settings(var_dir=var, redis_url="", embedded_redis_port=free_port())
    log = var / "log" / "redis.log"
    try:
        assert procs.ensure_redis(s) == "started"
        r = redis.Redis.from_url(s.redis_url)
        for _ in range(500):
            r.incr("acked")
        r.rpush("list", *range(100))
        # answered is not yet written: with `appendfsync everysec` a busy disk has Redis hold
        # the writes of up to 2 s in memory (docs/cli.md); this test is about the restart
        wait_aof_written(r)
        first = int((var / "redis" / "redis.pid").read_text())
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: (var / "redis" / "redis.pid").read_text().strip() != str(first)
                 and answers(s.redis_url), what="the restart")  # fmt: skip
        r = redis.Redis.from_url(s.redis_url)
        assert r.get("acked") == b"500" and r.llen("list") == 100
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=s.embedded_redis_port).ping()  # the same password
        lines = [line for line in log.read_text().splitlines() if "INFO" not in line]
        assert len(lines) == 1, lines
        assert f"WARNING/supervisor] redis: pid {first} killed by signal 9 after" in lines[0]
        assert "restarting in" in lines[0]
        assert procs.ensure_redis(s) == "running"
        supervisor = procs.alive(var / "run" / "redis.pid")
    finally:
        stopped = procs.stop_redis(s)
    assert stopped and supervisor is not None
    assert not (var / "run" / "redis.pid").exists()
    assert "stopped (code 0)" in log.read_text()
    time.sleep(2)  # a restart would have come by now (back-off 1 s)
    assert procs.embedded_redis_state(s) == "stopped"
    assert not procs.port_open("127.0.0.1", s.embedded_redis_port)


def test_a_command_started_while_the_embedded_redis_restarts_waits_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Between a death and the restart (its supervisor still runs) a command neither starts a
    second Redis nor calls it stopped: it says it waits, and goes on once Redis is back."""
    var = tmp_path / "var"
    s = Settings(var_dir=var, redis_url="", embedded_redis_port=free_port())
    try:
        assert procs.ensure_redis(s) == "started"
        supervisor = procs.alive(var / "run" / "redis.pid")
        assert supervisor is not None
        os.kill(supervisor, signal.SIGSTOP)  # the restart held back until SIGCONT
        try:
            os.kill(int((var / "redis" / "redis.pid").read_text()), signal.SIGKILL)
            wait_for(lambda: not procs.port_open("127.0.0.1", s.embedded_redis_port))
            assert procs.embedded_redis_state(s) == "restarting"
            done: list[str] = []
            waiting = threading.Thread(target=lambda: done.append(procs.ensure_redis(s)))
            waiting.start()
            wait_for(lambda: "restarting, waiting" in capsys.readouterr().err, what="the line")
            assert not done
        finally:
            os.kill(supervisor, signal.SIGCONT)
        waiting.join(60)
        assert done == ["running"]
        assert procs.alive(var / "run" / "redis.pid") == supervisor  # no second one
        assert answers(s.redis_url)
    finally:
        procs.stop_redis(s)


def test_an_embedded_redis_that_cannot_start_is_one_error_with_its_log_lines(
    tmp_path: Path,
) -> None:
    """A redis-server that exits at start (here: an append-only file it cannot read) is tried
    a few times by its supervisor, which then gives up: `start` fails (exit 1) with Redis's own
    last log lines, and nothing is left running."""
    var = tmp_path / "var"
    (var / "redis").mkdir(parents=True)
    (var / "redis" / "appendonly.aof").write_bytes(b"*3\r\n$3\r\nSET\r\nnot a command\r\n")
    s = Settings(var_dir=var, redis_url="", embedded_redis_port=free_port())
    try:
        with pytest.raises(StartFailed, match=r"did not start on port") as err:
            procs.ensure_redis(s)
        assert "append only file" in str(err.value), err.value
        assert "giving up" in (var / "log" / "redis.log").read_text()
        assert procs.embedded_redis_state(s) == "stopped"
    finally:
        procs.stop_redis(s)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def processes_of(var: Path) -> list[str]:
    """Command lines of running processes that name this var/ (a redis-server, its
    supervisor)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(var) in cmd:
            out.append(cmd)
    return out


READ_ONLY_COMMANDS = {
    "status": ("status", "--no-workers"),
    "runs": ("runs",),
    "report": ("report",),
    "deadletter": ("deadletter", "list"),
    "limits": ("limits",),
    "beat --status": ("beat", "--status"),  # beat itself starts it: not in READ_ONLY's help
    "monitor check": ("monitor", "check"),
}


@pytest.mark.integration
def test_read_only_commands_never_start_the_embedded_redis(tmp_path: Path) -> None:
    """`status`, `runs`, `report`, `deadletter list`, `limits`, `beat --status`, `monitor check`
    with the embedded Redis stopped (never started, or stopped by the operator): one line,
    exit 5, and no redis-server."""
    assert set(READ_ONLY) == {name for name in READ_ONLY_COMMANDS if " " not in name}
    env = {**own_env(tmp_path), "CHAINCRAWL_REDIS_WAIT": "600"}  # a wait would hit the timeout
    var = Path(env["CHAINCRAWL_VAR_DIR"])
    port = int(env["CHAINCRAWL_EMBEDDED_REDIS_PORT"])
    report = str(tmp_path / "report.html")

    def check(name: str, args: tuple[str, ...]) -> None:
        out = cli(env, *args, *(["--out", report] if name == "report" else []))
        assert out.returncode == 5, (name, out.stdout + out.stderr)
        assert out.stderr.splitlines() == [
            "error: the embedded Redis is stopped (start it with ./control.sh start)"
        ], (name, out.stderr)
        assert not procs.port_open("127.0.0.1", port), name
        assert not processes_of(var), (name, processes_of(var))

    for name in ("status", "runs"):  # never started here
        check(name, READ_ONLY_COMMANDS[name])
    assert not (var / "redis").exists()

    assert cli(env, "redis", "start").returncode == 0  # then stopped by the operator
    try:
        assert cli(env, "redis", "stop").stdout.strip() == "stopped"
        for name, args in READ_ONLY_COMMANDS.items():
            check(name, args)
        assert not (tmp_path / "report.html").exists()
    finally:
        cli(env, "redis", "stop")
