"""A private PostgreSQL server for tests and benchmarks: `initdb` into a folder of its own, a
free port on 127.0.0.1, its unix socket in that folder. The machine's own PostgreSQL service,
its port and its data are never touched.

PostgreSQL refuses to run as root: as root, the server runs as the `postgres` system user (else
`nobody`) through `runuser`, and the folder is handed to that user. `available()` says why a
server cannot be had here (no binaries, no psycopg), so callers can skip with the reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from utils.servers import free_port, wait_for_port

USER = "chaincrawl"
DATABASE = "chaincrawl"


def bin_dir() -> Path | None:
    """The newest PostgreSQL's binaries (`/usr/lib/postgresql/<n>/bin`, else on PATH)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _run_as() -> tuple[list[str], str | None]:
    """The command prefix that drops root, and the user it runs as (None: not root)."""
    if os.geteuid() != 0:
        return [], None
    for user in ("postgres", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", user, "--"], user
    raise RuntimeError("running as root with no `postgres`/`nobody` user or no runuser")


def available() -> str:
    """Why no server can be started here ("" when one can)."""
    if bin_dir() is None:
        return "no PostgreSQL binaries (initdb) on this machine"
    try:
        import psycopg  # noqa: F401 - only asked whether it is there
    except ImportError:
        return "psycopg is not installed (pip install -r requirements/postgres.txt)"
    try:
        _run_as()
    except RuntimeError as e:
        return str(e)
    return ""


class PostgresServer:
    """`start()`, `stop()` (and `start()` again: an outage), `close()` removes its folder."""

    def __init__(self, port: int | None = None, *, durable: bool = False) -> None:
        self.durable = durable  # False (tests): no fsync, no synchronous commit
        # a folder of its own in the system's temp dir: a test's tmp_path is root's alone
        # (0700), where the server's user could not reach its files
        self.root = Path(tempfile.mkdtemp(prefix="cc-pg-"))
        self.data = self.root / "data"
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.bin = bin_dir()
        if self.bin is None:
            raise RuntimeError(available())
        self.prefix, self.user = _run_as()

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    def _own(self, path: Path) -> None:
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _initdb(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self._own(self.root)
        assert self.bin is not None
        subprocess.run(
            [
                *self.prefix,
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def start(self, timeout: float = 60.0) -> PostgresServer:
        first = not (self.data / "PG_VERSION").exists()
        if first:
            self._initdb()
        assert self.bin is not None
        log = self.root / "postgres.log"
        if not log.exists():
            log.touch()
            self._own(log)
        cmd = [
            *self.prefix,
            str(self.bin / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.root}",
            "-c",
            "max_connections=50",
            "-c",
            "shared_buffers=32MB",
        ]
        if not self.durable:
            cmd += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_port(self.port, timeout=timeout)
            self._wait_ready(timeout)
            if first:
                self._create_database()
        except Exception:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.admin_url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or (self.proc and self.proc.poll() is not None):
                    raise
                time.sleep(0.2)

    @property
    def admin_url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def _create_database(self) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def _postmaster(self) -> int | None:
        """The server's own pid (runuser, our child, does not pass signals on)."""
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT to the postmaster): connections are cut, as in an outage."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        pid = self._postmaster()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid or proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid or proc.pid, signal.SIGKILL)
            proc.kill()
            proc.wait(10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
