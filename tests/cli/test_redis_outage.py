"""Commands outlive Redis: they wait out a restart or a Redis loading its append-only file,
saying so on one line, and fail with one line (exit 5), never a traceback, once
CHAINCRAWL_REDIS_WAIT has passed.

Each test runs the real `control.sh` on its own var/ and embedded-Redis port.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from config import ROOT
from tests.cli.test_demo_smoke import own_env
from utils.servers import free_port

CONTROL = str(ROOT / "control.sh")


def control(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([CONTROL, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def write_big_aof(path: Path, keys: int) -> int:
    """An append-only file of `keys` SETs (what a busy Redis leaves): seconds to load."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    value = b"v" * 40
    with open(path, "wb") as f:
        f.write(b"*2\r\n$6\r\nSELECT\r\n$1\r\n0\r\n")
        for chunk in range(0, keys, 10000):
            out = bytearray()
            for i in range(chunk, min(keys, chunk + 10000)):
                k = b"fill:%d" % i
                out += b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$40\r\n%s\r\n" % (len(k), k, value)
            f.write(out)
    return path.stat().st_size


def test_a_refused_redis_url_fails_at_once_with_one_line(tmp_path: Path) -> None:
    """Nothing listens at REDIS_URL: not a restart, so no CHAINCRAWL_REDIS_WAIT (here 600 s,
    which the subprocess timeout would hit); one line naming the URL without its password."""
    port = 1  # never listened on (a free port could be taken by another test's server meanwhile)
    env = {**own_env(tmp_path), "CHAINCRAWL_REDIS_URL": f"redis://:s3cret@127.0.0.1:{port}/0",
           "CHAINCRAWL_REDIS_WAIT": "600"}  # fmt: skip
    for args in (("status",), ("deadletter", "list"), ("runs",),
                 ("trigger", "demo_social", "--no-wait"), ("parse", "demo.pc.feed")):  # fmt: skip
        out = control(env, *args, timeout=120)
        assert out.returncode == 5, out.stdout + out.stderr
        assert "Traceback" not in out.stderr and "waiting" not in out.stderr, out.stderr
        # (control.sh may say first that it sets the venv up: lock files changed meanwhile)
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert errors == [
            f"error: Redis at redis://127.0.0.1:{port}/0 refused the connection "
            "(nothing listens there; REDIS_URL)"
        ], out.stderr
        assert "s3cret" not in out.stderr


@pytest.mark.integration
def test_trigger_waits_while_the_embedded_redis_loads_a_big_append_only_file(
    tmp_path: Path,
) -> None:
    env = own_env(tmp_path)
    size = write_big_aof(tmp_path / "var" / "redis" / "appendonly.aof", 2_000_000)
    assert size > 60_000_000
    try:
        out = control(env, "trigger", "demo_social", "--no-wait", timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "run id:" in out.stdout and "Traceback" not in out.stderr
        assert "is loading, waiting" in out.stderr, out.stderr
        assert "answers again" in out.stderr
    finally:
        control(env, "stop")


@pytest.mark.integration
def test_demo_survives_a_redis_restart_and_prints_its_summary(tmp_path: Path) -> None:
    env = own_env(tmp_path)
    log = tmp_path / "demo.out"
    cmd = [CONTROL, "demo", "--size", "small", "--port", str(free_port()), "--workers", "1",
           "--concurrency", "4", "--latency-ms", "100", "--no-flower"]  # fmt: skip
    try:
        with open(log, "w") as out:
            demo = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while "run id:" not in log.read_text() and demo.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2)
        assert demo.poll() is None, log.read_text()[-3000:]  # still crawling
        stopped = control(env, "redis", "stop")
        assert "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        time.sleep(3)
        started = control(env, "redis", "start")
        assert started.returncode == 0, started.stdout + started.stderr
        rc = demo.wait(600)
        text = log.read_text()
        assert rc == 0, text[-4000:]
        assert "Traceback" not in text
        assert "does not answer" in text and "answers again" in text
        assert "demo crawl summary" in text and "620 of 620 produced" in text, text[-4000:]
    finally:
        if demo.poll() is None:
            demo.kill()
        stop = control(env, "stop")
    assert stop.returncode == 0, stop.stdout + stop.stderr


def test_an_embedded_redis_never_started_is_said_at_once(tmp_path: Path) -> None:
    env = own_env(tmp_path)  # the embedded Redis on a free port, not started
    for args in (("status",), ("deadletter", "list")):  # no wait (120 s) for a restart
        out = control(env, *args, timeout=60)
        assert out.returncode == 2 and "Redis is not running" in out.stderr, out.stderr
        assert "waiting" not in out.stderr


@pytest.mark.integration
def test_a_worker_logs_a_redis_outage_in_one_line_and_its_end_in_another(
    tmp_path: Path,
) -> None:
    """A real worker (control.sh start), its embedded Redis stopped for ten seconds, twice:
    each outage is one warning line and one recovery line in the worker's log, no traceback,
    none of the retrying parts' own lines."""
    env = own_env(tmp_path)
    out = control(env, "start", "--workers", "1", "-c", "2", "--pool", "threads")
    assert out.returncode == 0, out.stdout + out.stderr
    log = tmp_path / "var" / "log" / "worker-w1.log"
    try:
        start = log.stat().st_size
        for n in (1, 2):
            assert control(env, "redis", "stop").returncode == 0
            time.sleep(10)  # every retrying part meets the outage several times
            assert control(env, "redis", "start").returncode == 0
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                text = log.read_bytes()[start:].decode(errors="replace")
                if text.count("Redis answers again after") == n:
                    break
                time.sleep(0.5)
        text = log.read_bytes()[start:].decode(errors="replace")
        warnings = [line for line in text.splitlines() if "WARNING" in line or "ERROR" in line]
        assert len(warnings) == 4, "\n".join(warnings)
        assert all("Redis does not answer (" in w for w in warnings[0::2]), warnings
        assert all("Redis answers again after" in w for w in warnings[1::2]), warnings
        assert "Traceback" not in text and "CPendingDeprecationWarning" not in text
    finally:
        control(env, "stop", "--timeout", "20")
