"""A crawl the CLI tests share: the test site, a private Redis and one worker started by the
real `./control.sh start` (stopped by `./control.sh stop` at the end)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from config import ROOT
from tests.testsite.server import TestSite
from utils.servers import RedisServer


def control(*args: str, env: dict[str, str], stdin: str | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run([str(ROOT / "control.sh"), *args], cwd=ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="session")
def cli_site() -> Iterator[TestSite]:
    site = TestSite().start()
    try:
        yield site
    finally:
        site.stop()


@pytest.fixture(scope="session")
def crawl_env(
    redis_server: RedisServer, cli_site: TestSite, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Environment of a control.sh talking to the private Redis, with the test site's endpoints
    and the CLI tests' chains (no worker: see `crawl`)."""
    var = tmp_path_factory.mktemp("clivar")
    keep = {k: v for k, v in os.environ.items() if not k.startswith("CHAINCRAWL_")}
    return {**keep, "CHAINCRAWL_REDIS_URL": redis_server.url,
            "CHAINCRAWL_KEY_PREFIX": f"cli{uuid.uuid4().hex[:6]}",
            "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.testsite",
            "CHAINCRAWL_EXTRA_CHAIN_PACKAGES": "tests.cli.clichains",
            "CHAINCRAWL_VAR_DIR": str(var), "CHAINCRAWL_JSONL_DIR": str(var / "items"),
            "CHAINCRAWL_SINKS": "jsonl", "CHAINCRAWL_MAX_RETRIES": "1",
            "CHAINCRAWL_RETRY_BACKOFF": "0.1", "CHAINCRAWL_RETRY_BACKOFF_MAX": "0.2",
            "CHAINCRAWL_OUTBOX_FLUSH_INTERVAL": "0.1", "CHAINCRAWL_LIMITS": "",
            "TESTSITE_URL": cli_site.url, "COLUMNS": "80"}  # fmt: skip


@pytest.fixture(scope="session")
def crawl(crawl_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`crawl_env` with one worker running (./control.sh start)."""
    out = control("start", "--workers", "1", "-c", "4", "--pool", "threads", "--name", "cli",
                  "--queues", "testsite,resources,default", env=crawl_env)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        yield crawl_env
    finally:
        control("stop", "--timeout", "20", env=crawl_env)
