"""Flower's `/metrics` and `/healthcheck` need credentials once Flower listens beyond loopback
(monitor/flower.py): Flower itself serves them to anyone, whatever its auth options."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from cli import procs
from config import ROOT, get_settings, reset_settings
from utils.servers import free_port, wait_for_port

pytestmark = pytest.mark.integration

OPEN = ("/metrics", "/healthcheck")


def _stop(pid: int) -> None:
    """SIGTERM a Flower started from this process and reap it (else it lingers as a zombie)."""
    try:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


@pytest.fixture
def flower_everywhere(
    cc_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, tuple[str, str]]]:
    """`control.sh flower` (cli.procs.start_flower) bound to 0.0.0.0, on a free port; the test
    talks to it on 127.0.0.1 only."""
    port = free_port("0.0.0.0")
    monkeypatch.setenv("CHAINCRAWL_FLOWER_ADDRESS", "0.0.0.0")
    monkeypatch.setenv("CHAINCRAWL_FLOWER_PORT", str(port))
    monkeypatch.delenv("CHAINCRAWL_FLOWER_PASSWORD", raising=False)
    reset_settings()
    s = get_settings()
    procs.start_flower(s)
    pidfile = procs.run_dir(s) / "flower.pid"
    try:
        password = (s.var_dir / "flower.secret").read_text().strip()
        yield f"http://127.0.0.1:{port}", (s.flower_user, password)
    finally:
        _stop(int(pidfile.read_text()))
        pidfile.unlink(missing_ok=True)
        monkeypatch.undo()
        reset_settings()


def test_metrics_and_healthcheck_need_credentials_beyond_loopback(
    flower_everywhere: tuple[str, tuple[str, str]],
) -> None:
    base, auth = flower_everywhere
    for path in OPEN:
        bare = requests.get(base + path, timeout=10)
        assert bare.status_code == 401 and bare.headers["WWW-Authenticate"].startswith("Basic")
        assert "flower_" not in bare.text and "celery" not in bare.text
        assert requests.get(base + path, auth=(auth[0], "wrong"), timeout=10).status_code == 401
    metrics = requests.get(base + "/metrics", auth=auth, timeout=10)
    assert metrics.status_code == 200 and "flower_" in metrics.text
    health = requests.get(base + "/healthcheck", auth=auth, timeout=10)
    assert health.status_code == 200 and health.text == "OK"
    assert requests.get(base + "/tasks", timeout=10).status_code == 401  # the pages, as before


def _flower(address: str, env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port(address)
    cmd = [sys.executable, "-m", "monitor.flower", f"--address={address}", f"--port={port}",
           "--persistent=False"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, "127.0.0.1", 30)
    except TimeoutError:
        _stop(proc.pid)
        raise AssertionError(log.read_text(errors="replace")[-3000:]) from None
    return proc, f"http://127.0.0.1:{port}"


def test_on_loopback_they_stay_open_and_beyond_it_without_credentials_they_refuse(
    cc_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
    local, local_url = _flower("127.0.0.1", {**env, "FLOWER_BASIC_AUTH": "u:p"}, tmp_path / "a")
    bare, bare_url = _flower("0.0.0.0", env, tmp_path / "b")  # no credentials at all
    try:
        for path in OPEN:  # a local scraper needs no credentials
            assert requests.get(local_url + path, timeout=10).status_code == 200
            assert requests.get(bare_url + path, timeout=10).status_code == 403
        assert requests.get(local_url + "/tasks", timeout=10).status_code == 401
    finally:
        _stop(local.pid)
        _stop(bare.pid)
