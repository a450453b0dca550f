"""bench/replay_site.py: the replay serves the demo's bytes for every page the benchmark crawl
requests, counts what it does not know, and keeps HTTP/1.1 keep-alive semantics."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import requests
import urllib3

from bench.replay_site import ReplayServer, target_of, walk
from bench.workload import expected_pages
from demo.testing import DemoServer

pytestmark = pytest.mark.integration

SIZE = (5, 3, 4)  # demo "tiny": U, P, C


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoServer]:
    with DemoServer(users=SIZE[0], posts_per_user=SIZE[1], comments_per_post=SIZE[2]) as d:
        yield d


@pytest.fixture(scope="module")
def replay(demo: DemoServer) -> Iterator[ReplayServer]:
    with ReplayServer(walk(demo.url), config=demo.config) as r:
        yield r


def test_walk_records_every_page_the_crawl_requests(replay: ReplayServer) -> None:
    assert len(replay.pages) == expected_pages(*SIZE)
    assert "/pc/feed?page=1" in replay.pages  # the crawl's seed
    assert "/pc/user/u1" in replay.pages  # the warm-up run's seed
    assert all(p.status == 200 for p in replay.pages.values())


def test_recorded_targets_are_what_clients_send(replay: ReplayServer) -> None:
    """Scrapy (w3lib), plain Celery (requests) and chaincrawl (urllib3) request these exact
    targets for the URLs both crawlers build with urljoin."""
    w3lib_url = pytest.importorskip("w3lib.url")
    for target in replay.pages:
        url = replay.url_for(target)
        assert w3lib_url.safe_url_string(url) == url
        assert requests.Request("GET", url).prepare().url == url
        assert urllib3.util.parse_url(url).request_uri == target
        assert target_of(url) == target


def test_same_bytes_as_the_demo(demo: DemoServer, replay: ReplayServer) -> None:
    http = urllib3.PoolManager()
    targets = ["/pc/feed?page=1", "/pc/user/u1", "/pc/post/p1", "/pc/post/p1/comments?page=1"]
    targets += sorted(replay.pages)[::7]
    for target in targets:
        want = http.request("GET", demo.url_for(target))
        got = http.request("GET", replay.url_for(target))
        assert got.status == want.status == 200, target
        assert got.headers["Content-Type"] == want.headers["Content-Type"], target
        assert got.data == want.data, target
    user_page = http.request("GET", replay.url_for("/pc/user/u1"))
    assert user_page.headers["Content-Type"] == "text/html; charset=gbk"


def test_unknown_path_is_404_and_counted(replay: ReplayServer) -> None:
    replay.reset()
    with requests.Session() as s:
        assert s.get(replay.url_for("/pc/feed?page=1")).status_code == 200
        assert s.get(replay.url_for("/pc/feed?page=99")).status_code == 404
        assert s.get(replay.url_for("/pc/feed")).status_code == 404  # not as the crawl asks
    st = replay.stats(timestamps=True)
    assert st["total"] == 3
    assert st["unknown"] == 2
    assert st["unknown_paths"] == ["GET /pc/feed?page=99", "GET /pc/feed"]
    assert st["by_status"] == {"200": 1, "404": 2}
    assert st["connections"] == 2  # the session's one keep-alive connection + this stats call
    assert len(st["recent"]["by_ip"]["127.0.0.1"]["timestamps"]) == 3
    replay.reset()
    assert replay.stats()["total"] == 0
    assert replay.cpu() > 0


def test_reset_keeps_counting_on_open_connections(replay: ReplayServer) -> None:
    """A crawler's warm-up opens keep-alive connections before the reset; the timed run reuses
    them and its arrival times must still be recorded."""
    with requests.Session() as s:
        s.get(replay.url_for("/pc/user/u1"))
        replay.reset()
        s.get(replay.url_for("/pc/user/u2"))
        s.get(replay.url_for("/pc/user/u3"))
    st = replay.stats(timestamps=True)
    assert st["total"] == 2
    assert len(st["recent"]["by_ip"]["127.0.0.1"]["timestamps"]) == 2


def test_keep_alive_and_pipelined_requests_answer_in_order(replay: ReplayServer) -> None:
    a, b = "/pc/feed?page=1", "/pc/user/u2"
    req = "GET {} HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection((replay.host, replay.port), timeout=5) as sock:
        sock.sendall((req.format(a) + req.format(b)).encode())
        want = replay.pages[a].wire() + replay.pages[b].wire()
        got = b""
        while len(got) < len(want):
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            got += chunk
        assert got == want
        sock.sendall(req.format(a).encode())  # the connection is still open
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")


def test_connection_close_is_honoured(replay: ReplayServer) -> None:
    with socket.create_connection((replay.host, replay.port), timeout=5) as sock:
        sock.sendall(b"GET /pc/user/u1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"\r\nConnection: close" in head
    assert body == replay.pages["/pc/user/u1"].body


def test_record_and_fixed_latency() -> None:
    """record() walks its own demo server (without latency) and stops it; the replay delays
    every response by latency_ms, pipelined ones too."""
    srv = ReplayServer.record(users=2, posts_per_user=2, comments_per_post=1, latency_ms=200)
    assert len(srv.pages) == expected_pages(2, 2, 1)
    assert srv.config is not None
    assert srv.config.latency_ms == 200 and srv.config.users == 2
    with srv, requests.Session() as s:
        t0 = time.monotonic()
        for _ in range(2):
            assert s.get(srv.url_for("/pc/feed?page=1")).status_code == 200
        assert time.monotonic() - t0 >= 0.4
