"""Flower end to end in headless Chromium: real workers, a real run, basic auth, masked args.

Needs Debian's `chromium` and `chromium-driver` and Selenium (PyPI); skips without them.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

import chains
from cli import procs
from config import get_settings, reset_settings
from monitor.status import task_argsrepr
from tests.testsite import chains as tchains
from tests.testsite.server import PAGES
from utils.servers import free_port

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401

    HAVE_SELENIUM = True
except ImportError:
    HAVE_SELENIUM = False

needs_browser = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER and HAVE_SELENIUM),
    reason="needs chromium + chromedriver (apt-get install -y chromium chromium-driver) "
    "and selenium (pip install selenium)",
)

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1600,1000",
)  # fmt: skip


@pytest.fixture
def flower(cc_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """`control.sh flower` (cli.procs.start_flower) on a free port, with the generated password."""
    port = free_port()
    monkeypatch.setenv("CHAINCRAWL_FLOWER_PORT", str(port))
    monkeypatch.delenv("CHAINCRAWL_FLOWER_PASSWORD", raising=False)
    reset_settings()
    s = get_settings()
    _url, where = procs.start_flower(s)
    try:
        password = (s.var_dir / "flower.secret").read_text().strip()
        assert where == str(s.var_dir / "flower.secret")
        yield {"base": f"http://127.0.0.1:{port}", "user": s.flower_user, "password": password}
    finally:
        _stop_child(procs.run_dir(s) / "flower.pid")
        monkeypatch.delenv("CHAINCRAWL_FLOWER_PORT")
        reset_settings()


def _stop_child(pidfile: Path) -> None:
    """SIGTERM Flower and reap it: started from this process, it would linger as a zombie
    (which `kill -0` still sees) where `control.sh` would have let init reap it."""
    pid = procs.alive(pidfile)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        try:
            while os.waitpid(pid, os.WNOHANG)[0] == 0:
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.1)
        except ChildProcessError:  # not our child after all: control.sh's own wait applies
            procs.stop_named("flower", get_settings(), 20)
    pidfile.unlink(missing_ok=True)


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM  # type: ignore[assignment]
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="cc-chromium-")
    opts.add_argument(f"--user-data-dir={profile}")
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def document_status(driver: Any, url: str) -> int | None:
    """The HTTP status the browser got for `url`, from its network log."""
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.responseReceived":
            resp = msg["params"]["response"]
            if resp["url"] == url and msg["params"].get("type") == "Document":
                return int(resp["status"])
    return None


def wait_for(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@needs_browser
def test_flower_shows_the_runs_tasks_behind_basic_auth(start_worker, flower, browser) -> None:
    from selenium.webdriver.common.by import By

    from worker import app

    base, auth = flower["base"], (flower["user"], flower["password"])

    # no credentials (or wrong ones): 401, for a plain client and for the browser
    assert requests.get(f"{base}/tasks", timeout=10).status_code == 401
    assert requests.get(f"{base}/api/tasks", auth=(auth[0], "wrong"), timeout=10).status_code == 401
    browser.get(f"{base}/tasks")
    assert document_status(browser, f"{base}/tasks") == 401
    assert "testsite" not in browser.page_source

    start_worker(concurrency=4, name="fl", CHAINCRAWL_TASK_EVENTS="1")  # off by default

    def worker_seen() -> bool:  # from the worker's events: Flower listens on our broker
        status = requests.get(f"{base}/api/workers?status=1", auth=auth, timeout=10).json()
        return any(name.startswith("fl") and alive for name, alive in status.items())

    try:
        wait_for(worker_seen, 30, "Flower to see the worker's events")
    except AssertionError:
        log = get_settings().var_dir / "log" / "flower.log"
        raise AssertionError(log.read_text(errors="replace")[-3000:]) from None
    run = chains.run(tchains.three_step(delay=0.2), seeds=[{"page": 1}])
    # a message carrying secret-looking values, sent the way send_kid sends with argsrepr set
    probe_id = uuid.uuid4().hex
    params = {"path": "/detail/e1-0?token=SECRET-TOKEN-1", "entry_id": ""}
    meta = {"cookie": "sid=SECRET-COOKIE-2", "proxy": "http://u:SECRET-PW-3@127.0.0.1:9"}
    app.send_task("testsite.local.probe", args=(params, meta), task_id=probe_id,
                  argsrepr=task_argsrepr(params, meta), kwargsrepr="{}")  # fmt: skip
    run.wait(timeout=90)

    header = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": header}})

    browser.get(f"{base}/tasks")
    assert document_status(browser, f"{base}/tasks") == 200

    def rows(prefix: str) -> list[str]:
        lines = browser.find_element(By.ID, "tasks-table").text.splitlines()
        return [ln for ln in lines if ln.startswith(prefix)]

    first = wait_for(lambda: rows("testsite.local."), 30, "the tasks table to list the run's tasks")
    assert any(" SUCCESS " in ln for ln in first)
    # older tasks are pages back: find each endpoint's with the search box
    search = browser.find_element(By.CSS_SELECTOR, "input[type=search]")
    for name in ("testsite.local.listing", "testsite.local.detail", "testsite.local.probe"):
        search.clear()
        search.send_keys(name)

        def only(n: str = name) -> list[str]:
            shown = rows("testsite.")
            return shown if shown and all(ln.split()[0] == n for ln in shown) else []

        found = wait_for(only, 30, f"the search to show only {name}")
        if name == "testsite.local.listing":
            assert len(found) == PAGES

    browser.get(f"{base}/task/{probe_id}")
    page = wait_for(lambda: browser.find_element(By.TAG_NAME, "body").text, 15, "the task page")
    assert "testsite.local.probe" in page
    assert "'cookie': '***'" in page and "token=***" in page and "'entry_id': ''" in page
    for secret in ("SECRET-TOKEN-1", "SECRET-COOKIE-2", "SECRET-PW-3"):
        assert secret not in browser.page_source, secret
