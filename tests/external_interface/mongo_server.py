"""A real MongoDB wire-protocol server for the storage tests: `MONGO_URL`, else nx-27017.

nx-27017 (pip package `nx-27017`) is a MongoDB wire-protocol server backed by SQLite. The
tests run it as a child process on a free port with its files in a temp dir:

    nx-27017 --data-dir DIR --host 127.0.0.1 -p PORT --log-file DIR/nx.log --pid-file DIR/nx.pid

(`--data-dir` keeps one SQLite file per database; `--log-file`/`--pid-file` must be given, or
it writes to /tmp/nx_27017.* shared with everyone else.) With `MONGO_URL` set, the tests use
that server instead, each test in a database of its own that is dropped afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pymongo
import pytest

from utils.servers import free_port, wait_for_port


def nx_binary() -> str:
    exe = Path(sys.executable).parent / "nx-27017"
    if exe.exists():
        return str(exe)
    found = shutil.which("nx-27017")
    if not found:
        pytest.skip("nx-27017 is not installed and MONGO_URL is not set")
    return found


class MongoServer:
    """nx-27017 on a port of ours; `stop()` and `start()` again to simulate an outage."""

    def __init__(self, data_dir: Path | str, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/"

    def start(self, timeout: float = 20.0) -> MongoServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            nx_binary(),
            "--data-dir", str(self.data_dir),
            "--host", "127.0.0.1",
            "-p", str(self.port),
            "--log-file", str(self.data_dir / "nx.log"),
            "--pid-file", str(self.data_dir / "nx.pid"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=self.data_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_for_port(self.port, timeout=timeout)
            client: pymongo.MongoClient = pymongo.MongoClient(
                self.url, serverSelectionTimeoutMS=int(timeout * 1000)
            )
            try:
                client.admin.command("ping")
            finally:
                client.close()
        except Exception:
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
        # the port must be free again before a restart binds it
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                wait_for_port(self.port, timeout=0.05)
            except TimeoutError:
                return
            time.sleep(0.05)

    def __enter__(self) -> MongoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="module")
def mongo_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`MONGO_URL` when given, else a private nx-27017 for the test module."""
    external = os.environ.get("MONGO_URL", "").strip()
    if external:
        yield external
        return
    server = MongoServer(tmp_path_factory.mktemp("nx27017")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def mongo_db(mongo_url: str) -> Iterator[str]:
    """A database name unique to this test, dropped afterwards."""
    name = f"cc_test_{uuid.uuid4().hex[:10]}"
    yield name
    client: pymongo.MongoClient = pymongo.MongoClient(mongo_url, serverSelectionTimeoutMS=5000)
    try:
        client.drop_database(name)
    except pymongo.errors.PyMongoError:
        pass
    finally:
        client.close()
