"""Integration: /headers, /proxies, /admin/stats, latency, and the CLI process lifecycle."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from parsel import Selector

from demo.testing import REPO_ROOT, DemoServer
from utils.servers import free_port

pytestmark = pytest.mark.integration


def test_headers_echo(tiny_server: DemoServer, http: requests.Session) -> None:
    body = http.get(
        tiny_server.url + "/headers?x=1",
        headers={"X-Forwarded-For": "203.0.113.9", "Via": "1.1 squid", "User-Agent": "probe/1"},
    ).json()
    assert body["remote_addr"] == "127.0.0.1"
    assert body["headers"]["X-Forwarded-For"] == "203.0.113.9"
    assert body["headers"]["Via"] == "1.1 squid"
    assert body["headers"]["User-Agent"] == "probe/1"
    assert body["path"] == "/headers?x=1"


def test_proxies_pages_and_file(
    tmp_path: Path, http: requests.Session, tiny_server: DemoServer
) -> None:
    listed = [f"127.0.0.1:{9000 + i}" for i in range(25)] + ["socks5://127.0.0.2:1080"]
    extra = tmp_path / "proxies.txt"
    extra.write_text("# comment\n127.0.0.3:3128\n\n")
    with DemoServer(size="tiny", proxies=listed, proxies_file=str(extra)) as server:

        def rows(page: int) -> list[tuple[str | None, str | None, str | None]]:
            sel = Selector(http.get(server.url + f"/proxies?page={page}").text)
            assert sel.css(".total-pages::text").get() == "2"
            return [
                (r.css(".ip::text").get(), r.css(".port::text").get(), r.css(".type::text").get())
                for r in sel.css("tr.proxy")
            ]

        all_rows = rows(1) + rows(2)
        assert len(all_rows) == 27 and all_rows[0] == ("127.0.0.1", "9000", "http")
        assert ("127.0.0.2", "1080", "socks5") in all_rows and all_rows[-1][0] == "127.0.0.3"
        extra.write_text("")  # the file is re-read per request
        sel = Selector(http.get(server.url + "/proxies?page=2").text)
        assert len(sel.css("tr.proxy")) == 6
        assert http.get(server.url + "/proxies?page=3").status_code == 404
    sel = Selector(http.get(tiny_server.url + "/proxies").text)  # no proxies configured
    assert sel.css(".total-pages::text").get() == "1" and not sel.css("tr.proxy")


def test_stats_and_reset(http: requests.Session) -> None:
    with DemoServer(size="tiny") as server:
        for _ in range(3):
            http.get(server.url + "/pc/feed")
        http.get(server.url + "/h5/api/post/p1")
        http.get(server.url + "/app/api/detail", params={"post_id": "p99"})
        http.get(server.url + "/healthz")  # not counted
        stats = server.stats(timestamps=True)
        assert stats["total"] == 5
        assert stats["by_front"] == {"pc": 3, "h5": 1, "app": 1}
        assert stats["by_endpoint"] == {"pc.feed": 3, "h5.post": 1, "app.detail": 1}
        assert stats["by_status"] == {"200": 4, "404": 1}
        assert stats["by_ip"] == {"127.0.0.1": 5}
        recent = stats["recent"]["by_ip"]["127.0.0.1"]
        assert recent["count"] == 5 and len(recent["timestamps"]) == 5
        assert abs(recent["last"] - time.time()) < 5 and recent["max_in_any_1s"] == 5
        assert "timestamps" not in server.stats()["recent"]["by_ip"]["127.0.0.1"]
        server.reset()
        stats = server.stats()
        assert stats["total"] == 0 and stats["by_endpoint"] == {} and stats["recent"]["by_ip"] == {}
        cfg = http.get(server.url + "/admin/config").json()
        assert cfg["config"]["users"] == 5 and cfg["expected"]["posts"] == 15


def test_latency_does_not_block_other_connections() -> None:
    with DemoServer(size="tiny", latency_ms=300) as server:
        start = time.monotonic()
        with ThreadPoolExecutor(20) as pool:
            codes = list(
                pool.map(lambda _: requests.get(server.url + "/h5/api/feed").status_code, range(20))
            )
        elapsed = time.monotonic() - start
        assert codes == [200] * 20
        assert 0.3 <= elapsed < 4  # 20 x 300 ms in parallel, not 6 s in series
        assert server.stats()["max_in_flight"] >= 5


def test_cli_runs_in_foreground_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "demo.yaml"
    cfg.write_text("size: tiny\nfeatures: [login]\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "demo", "--config", str(cfg), "--port", str(port), "--seed", "3"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith(f"demo server ready at http://127.0.0.1:{port} ")
        assert "features=login" in line and "users=5" in line
        assert requests.get(f"http://127.0.0.1:{port}/healthz").text == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_rejects_bad_config() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "demo", "--features", "nope"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "unknown features" in r.stderr


def test_demo_server_reports_startup_failure() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = DemoServer(size="tiny", port=busy.getsockname()[1], startup_timeout=10)
        with pytest.raises(RuntimeError, match=r"(?i)address already in use"):
            server.start()
        assert server.proc is None
