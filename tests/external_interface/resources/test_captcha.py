"""Captcha recognition: the dot-matrix recognizer against real demo captchas (every answer
checked by logging in), tolerance and refusal, and the HTTP solver against a local fake service."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import requests
from aiohttp import web

from demo import captcha as reference
from demo.testing import DemoServer
from exceptions import ConfigError
from external_interface.resources.captcha import (
    CaptchaServiceError,
    CaptchaStats,
    CaptchaUnsolved,
    Challenge,
    DotMatrixRecognizer,
    HttpSolver,
    get_recognizer,
    solve,
)
from utils.servers import free_port

README_3458 = "\n".join(
    [
        "#####....#..#####..###.",
        "...#....##..#.....#...#",
        "..#....#.#..####..#...#",
        "...#..#..#......#..###.",
        "....#.#####.....#.#...#",
        "#...#....#..#...#.#...#",
        ".###.....#...###...###.",
    ]
)


def test_readme_example() -> None:
    assert DotMatrixRecognizer().recognize(Challenge(README_3458, length=4)) == "3458"


def test_our_glyphs_are_the_sites_glyphs() -> None:
    from external_interface.resources.captcha import GLYPHS

    assert {d: tuple(rows) for d, rows in reference.FONT.items()} == GLYPHS


@pytest.mark.parametrize("length", [4, 12])
def test_every_demo_captcha_is_solved_and_accepted_by_the_site(length: int) -> None:
    rec = DotMatrixRecognizer()
    with DemoServer(size="tiny", captcha_length=length) as demo, requests.Session() as s:
        for i in range(60 if length == 4 else 20):
            c = s.get(demo.url + "/login/captcha", timeout=5).json()
            answer = rec.recognize(Challenge(c["image"], c["format"], c["length"]))
            assert len(answer) == length
            r = s.post(demo.url + "/login", timeout=5, data={
                "username": "demo1", "password": "pass-demo1",
                "captcha_id": c["captcha_id"], "captcha_answer": answer,
            })  # fmt: skip
            assert r.status_code == 200, (i, r.text)
        logins = demo.stats()["logins"]
        assert logins["bad_captcha"] == 0 and logins["ok"] == logins["captchas_issued"]


def test_a_few_flipped_dots_are_tolerated_noise_is_refused() -> None:
    rows = [list(r) for r in README_3458.split("\n")]
    rows[0][0] = "."  # one dot off in the first digit
    rows[3][20] = "#"
    noisy = "\n".join("".join(r) for r in rows)
    assert DotMatrixRecognizer().recognize(Challenge(noisy)) == "3458"
    blob = "\n".join("#" * 23 for _ in range(7))
    with pytest.raises(CaptchaUnsolved):
        DotMatrixRecognizer().recognize(Challenge(blob))
    with pytest.raises(CaptchaUnsolved):
        DotMatrixRecognizer().recognize(Challenge(README_3458, length=5))
    with pytest.raises(CaptchaUnsolved):
        DotMatrixRecognizer().recognize(Challenge("##\n##"))


def test_solve_counts_a_deterministic_failure_once(rds: redis.Redis, key_prefix: str) -> None:
    stats = CaptchaStats("shop", rds, key_prefix)
    assert (
        solve(Challenge("garbage"), "shop", recognizer=DotMatrixRecognizer(), stats=stats) is None
    )
    assert (
        solve(Challenge(README_3458), "shop", recognizer=DotMatrixRecognizer(), stats=stats)
        == "3458"
    )
    assert stats.read() == {"failed": 1, "failed:CaptchaUnsolved": 1, "solved": 1}


# --- the external service ----------------------------------------------------------------


class FakeService:
    """A solving service on 127.0.0.1: `script` lists what /solve answers, in order; polled
    tasks become ready after `polls` result requests."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, Any]]] = []
        self.polls = 0
        self.requests: list[tuple[str, str, Any]] = []
        self.port = free_port()
        self._pending: dict[str, int] = {}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/solve", self._solve)
        app.router.add_get("/result/{id}", self._result)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _solve(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("solve", request.headers.get("Authorization", ""), body))
        status, data = self.script.pop(0) if self.script else (200, {"answer": "0000"})
        if data.get("status") == "pending":
            self._pending[data["id"]] = self.polls
        return web.json_response(data, status=status)

    async def _result(self, request: web.Request) -> web.Response:
        tid = request.match_info["id"]
        self.requests.append(("result", request.headers.get("Authorization", ""), tid))
        left = self._pending.get(tid, 0)
        if left > 0:
            self._pending[tid] = left - 1
            return web.json_response({"status": "pending"})
        return web.json_response({"status": "ready", "answer": reference.solve(README_3458)})

    def start(self) -> FakeService:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def service() -> Iterator[FakeService]:
    svc = FakeService().start()
    try:
        yield svc
    finally:
        svc.stop()


def test_http_solver_immediate_answer_with_key(service: FakeService) -> None:
    service.script = [(200, {"answer": "3458"})]
    solver = HttpSolver(service.url, key="k-123", timeout=5)
    assert solver.recognize(Challenge(README_3458, length=4)) == "3458"
    kind, auth, body = service.requests[0]
    assert (kind, auth) == ("solve", "Bearer k-123")
    assert body == {"format": "ascii-5x7", "image": README_3458, "length": 4}
    assert "k-123" not in repr(solver)


def test_http_solver_polls_a_pending_task(service: FakeService) -> None:
    service.script = [(200, {"id": "t1", "status": "pending"})]
    service.polls = 2
    solver = HttpSolver(service.url, timeout=5, poll_interval=0.05)
    assert solver.recognize(Challenge(README_3458)) == "3458"
    assert [r[0] for r in service.requests] == ["solve", "result", "result", "result"]


def test_transient_service_errors_are_counted_and_retried(
    service: FakeService, rds: redis.Redis, key_prefix: str
) -> None:
    service.script = [(503, {"error": "busy"}), (500, {"error": "oops"}), (200, {"answer": "3458"})]
    stats = CaptchaStats("shop", rds, key_prefix)
    solver = HttpSolver(service.url, timeout=5)
    answer = solve(Challenge(README_3458), "shop", recognizer=solver, stats=stats, backoff=0.01)
    assert answer == "3458"
    assert stats.read() == {"failed": 2, "failed:CaptchaServiceError": 2, "solved": 1}


def test_a_definite_refusal_is_not_retried(
    service: FakeService, rds: redis.Redis, key_prefix: str
) -> None:
    service.script = [(200, {"status": "failed", "error": "unreadable"}), (200, {"answer": "1"})]
    stats = CaptchaStats("shop", rds, key_prefix)
    solver = HttpSolver(service.url, timeout=5)
    assert solve(Challenge(README_3458), "shop", recognizer=solver, stats=stats) is None
    assert len(service.requests) == 1
    assert stats.read() == {"failed": 1, "failed:CaptchaUnsolved": 1}


def test_unreachable_or_slow_service_is_a_service_error(service: FakeService) -> None:
    with pytest.raises(CaptchaServiceError):
        HttpSolver(f"http://127.0.0.1:{free_port()}", timeout=1).recognize(Challenge(README_3458))
    service.script = [(200, {"id": "slow", "status": "pending"})]
    service.polls = 1000
    with pytest.raises(CaptchaServiceError):
        HttpSolver(service.url, timeout=0.5, poll_interval=0.1).recognize(Challenge(README_3458))


def test_recognizer_choice_by_format_and_environment(
    service: FakeService, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(get_recognizer("demo", "ascii-5x7"), DotMatrixRecognizer)
    with pytest.raises(CaptchaUnsolved):
        get_recognizer("shop", "png")
    monkeypatch.setenv("CHAINCRAWL_CAPTCHA_SHOP", "http")
    with pytest.raises(ConfigError):  # a service is chosen but not configured
        get_recognizer("shop", "png")
    monkeypatch.setenv("CHAINCRAWL_CAPTCHA_SERVICE_URL", service.url)
    rec = get_recognizer("shop", "png")
    assert isinstance(rec, HttpSolver) and rec.url == service.url
