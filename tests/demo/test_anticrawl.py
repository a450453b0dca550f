"""Integration: every anti-crawl feature rejects what it should and accepts what it should."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
import requests
from parsel import Selector

from demo import captcha, signing
from demo.testing import DemoServer
from tests.demo.conftest import APP_UA, DESKTOP_UA, MOBILE_UA

pytestmark = pytest.mark.integration


# --- rate limit -------------------------------------------------------------------------------
def test_rate_limit_then_ban_then_recovery(http: requests.Session) -> None:
    with DemoServer(
        size="tiny", features=["rate_limit"], rate_limit_requests=5, rate_limit_window_s=2,
        rate_limit_ban_after=3, rate_limit_ban_s=1.0,
    ) as server:  # fmt: skip
        url = server.url + "/h5/api/feed"
        # X-Forwarded-For must not help: the limit is on the connection's source address.
        codes = [
            http.get(url, headers={"X-Forwarded-For": f"10.0.0.{i}"}).status_code for i in range(7)
        ]
        assert codes == [200] * 5 + [429, 429]
        limited = http.get(url)  # third strike: banned now
        assert limited.status_code == 403 and limited.json()["error"] == "banned"
        banned_pc = http.get(server.url + "/pc/feed")
        assert banned_pc.status_code == 403
        assert Selector(banned_pc.text).css(".error::attr(data-error)").get() == "banned"
        assert "banned" in banned_pc.text
        stats = server.stats()
        assert stats["bans"]["ip_bans_total"] == 1 and "127.0.0.1" in stats["bans"]["ip_banned_now"]
        assert stats["rejections"] == {"rate_limited": 2, "banned": 2}
        time.sleep(1.1)
        assert http.get(url).status_code == 200  # ban expired
        r429 = [http.get(url) for _ in range(6)][-1]
        assert r429.status_code == 429 and int(r429.headers["Retry-After"]) >= 1
        assert r429.json()["error"] == "rate_limited"


# --- user agent -------------------------------------------------------------------------------
def test_ua_rules(http: requests.Session) -> None:
    with DemoServer(size="tiny", features=["ua_check"]) as server:
        cases = {
            "/pc/feed": {DESKTOP_UA: 200, MOBILE_UA: 403, APP_UA: 403, "python-requests/2": 403},
            "/h5/api/feed": {DESKTOP_UA: 403, MOBILE_UA: 200, APP_UA: 403, "": 403},
            "/app/api/feed": {DESKTOP_UA: 403, MOBILE_UA: 403, APP_UA: 200, "DemoApp/x": 403},
            "/headers": {"curl/8": 200},
        }
        for path, by_ua in cases.items():
            for ua, want in by_ua.items():
                r = http.get(server.url + path, headers={"User-Agent": ua})
                assert r.status_code == want, (path, ua)
                if want == 403 and path != "/pc/feed":
                    assert r.json()["error"] == "bad_user_agent"
        r = http.get(server.url + "/pc/feed", headers={"User-Agent": MOBILE_UA})
        assert 'data-error="bad_user_agent"' in r.text


# --- sign -------------------------------------------------------------------------------------
def test_sign(http: requests.Session) -> None:
    with DemoServer(size="tiny", features=["sign"], sign_key="k3y") as server:
        url = server.url + "/app/api/user_info"
        plain = {"user_id": "u2"}
        assert http.get(url, params=plain).json()["error"] == "bad_sign"
        good = signing.signed(plain, "k3y")
        assert http.get(url, params=good).json()["data"]["id"] == "u2"
        cases = [
            signing.signed(plain, "demo-sign-key"),  # wrong key
            signing.signed(plain, "k3y", ts=int(time.time()) - 400),  # outside the skew
            {**good, "user_id": "u3"},  # tampered after signing
            {**good, "ts": "soon"},
        ]
        for params in cases:
            r = http.get(url, params=params)
            assert r.status_code == 403 and r.json()["error"] == "bad_sign", params
        near = signing.signed(plain, "k3y", ts=int(time.time()) - 200)
        assert http.get(url, params=near).status_code == 200
        # Non-ASCII values are signed decoded, not percent-encoded.
        r = http.get(server.url + "/app/api/feed", params=signing.signed({"q": "新闻"}, "k3y"))
        assert r.status_code == 200
        # pc and h5 are not signed
        assert http.get(server.url + "/h5/api/feed").status_code == 200


# --- device -----------------------------------------------------------------------------------
def test_device_registration_and_ban(http: requests.Session) -> None:
    with DemoServer(size="tiny", features=["device"], device_ban_rpm=3) as server:
        url = server.url + "/app/api/feed"
        r = http.get(url)
        assert r.status_code == 403 and r.json()["error"] == "unknown_device"
        assert http.get(url, headers={"X-Device-Id": "dev-forged"}).json()["error"] == (
            "unknown_device"
        )
        reg = server.url + "/app/api/device/register"
        assert http.post(reg, json={"model": "Pixel"}).status_code == 400
        body = http.post(reg, json={"model": "Pixel 8", "os": "Android 14"}).json()
        device = body["device_id"]
        assert body["data"]["device_id"] == device
        headers = {"X-Device-Id": device}
        assert [http.get(url, headers=headers).status_code for _ in range(3)] == [200] * 3
        r = http.get(url, headers=headers)  # fourth request within a minute
        assert r.status_code == 403 and r.json()["error"] == "device_banned"
        stats = server.stats()
        assert stats["devices"]["registered"] == 1 and stats["devices"]["banned"] == 1
        other = http.post(reg, json={"model": "iPhone", "os": "iOS 17"}).json()["device_id"]
        assert http.get(url, headers={"X-Device-Id": other}).status_code == 200


def test_all_app_protections_together(http: requests.Session) -> None:
    with DemoServer(size="tiny", features=["ua_check", "sign", "device"]) as server:
        http.headers["User-Agent"] = APP_UA
        reg = server.url + "/app/api/device/register"
        assert http.post(reg, json={"model": "m", "os": "o"}).json()["error"] == "bad_sign"
        device = http.post(reg, params=signing.signed({}), json={"model": "m", "os": "o"}).json()
        r = http.get(
            server.url + "/app/api/detail",
            params=signing.signed({"post_id": "p1"}),
            headers={"X-Device-Id": device["device_id"]},
        )
        assert r.status_code == 200 and r.json()["data"]["id"] == "p1"


# --- login ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def login_server() -> Iterator[DemoServer]:
    with DemoServer(size="tiny", features=["login"], session_ban_rpm=8) as server:
        yield server


def _captcha(http: requests.Session, base: str) -> tuple[str, str]:
    body = http.get(base + "/login/captcha").json()
    assert body["format"] == "ascii-5x7" and body["height"] == 7
    return body["captcha_id"], captcha.solve(body["image"])


def _login(http: requests.Session, base: str, user: str, password: str) -> requests.Response:
    cid, answer = _captcha(http, base)
    return http.post(
        base + "/login",
        data={"username": user, "password": password, "captcha_id": cid, "captcha_answer": answer},
    )


def test_login_wall(login_server: DemoServer, http: requests.Session) -> None:
    base = login_server.url
    pc = http.get(base + "/pc/post/p1/comments")
    assert pc.status_code == 200  # like real sites: detect the wall from the body
    sel = Selector(pc.text)
    assert sel.css("#login-wall form.login-form input[name=captcha_answer]")
    assert not sel.css("li.comment")
    for path in ("/h5/api/post/p1/comments", "/app/api/comments?post_id=p1"):
        r = http.get(base + path)
        assert r.status_code == 401 and r.json()["error"] == "login_required"
    assert http.get(base + "/pc/post/p1").status_code == 200  # only comments need a login
    r = http.get(base + "/h5/api/post/p1/comments", cookies={"session": "forged"})
    assert r.status_code == 401


def test_login_with_captcha(login_server: DemoServer, http: requests.Session) -> None:
    base = login_server.url
    cid, answer = _captcha(http, base)
    wrong = str((int(answer) + 1) % 10**4).zfill(4)
    form = {"username": "demo3", "password": "pass-demo3", "captcha_id": cid}
    r = http.post(base + "/login", data={**form, "captcha_answer": wrong})
    assert r.status_code == 403 and r.json()["error"] == "bad_captcha"
    r = http.post(base + "/login", data={**form, "captcha_answer": answer})  # consumed
    assert r.status_code == 403 and r.json()["error"] == "bad_captcha"
    r = _login(http, base, "demo3", "wrong-password")
    assert r.status_code == 403 and r.json()["error"] == "bad_credentials"
    assert "session" not in http.cookies
    r = _login(http, base, "demo3", "pass-demo3")
    assert r.status_code == 200 and r.json()["username"] == "demo3" and http.cookies["session"]
    assert Selector(http.get(base + "/pc/post/p1/comments").text).css("li.comment")
    assert len(http.get(base + "/h5/api/post/p1/comments").json()["data"]["list"]) == 4
    r = http.get(base + "/app/api/comments", params={"post_id": "p1"})
    assert r.json()["data"]["total"] == 4
    logins = login_server.stats()["logins"]
    assert logins["ok"] >= 1 and logins["bad_captcha"] >= 2 and logins["bad_credentials"] >= 1


def test_session_ban(login_server: DemoServer, http: requests.Session) -> None:
    base = login_server.url
    assert _login(http, base, "demo7", "pass-demo7").status_code == 200
    codes = [http.get(base + "/h5/api/post/p2/comments").status_code for _ in range(9)]
    assert codes == [200] * 8 + [401]  # ninth use within a minute bans the session
    assert http.get(base + "/pc/post/p2/comments").text.count("login-wall") >= 1
    assert _login(http, base, "demo7", "pass-demo7").status_code == 200  # a new session works
    assert http.get(base + "/h5/api/post/p2/comments").status_code == 200


# --- soft failures ----------------------------------------------------------------------------
def _outcome(url: str) -> str:
    """How one request went: ok, slow, truncate or error<status>."""
    start = time.monotonic()
    try:
        r = requests.get(url, timeout=10)
    except requests.exceptions.ChunkedEncodingError:
        return "truncate"
    if r.status_code >= 500:
        return f"error{r.status_code}"
    assert r.status_code == 200
    return "slow" if time.monotonic() - start >= 0.12 else "ok"


def test_soft_failures_at_rate_one(http: requests.Session) -> None:
    with DemoServer(
        size="tiny", features=["soft_fail"], soft_fail_rate=1.0, soft_fail_slow_ms=150
    ) as server:
        seen = Counter(_outcome(server.url + "/h5/api/feed") for _ in range(24))
        assert "ok" not in seen
        assert seen["slow"] and seen["truncate"]
        assert {k for k in seen if k.startswith("error")} == {"error500", "error502", "error503"}
        stats = server.stats()
        assert sum(stats["soft_fail"].values()) == 24
        assert stats["soft_fail"]["truncate"] == seen["truncate"]
        # pc errors are HTML pages
        codes = set()
        for _ in range(18):
            try:
                r = http.get(server.url + "/pc/feed", timeout=10)
            except requests.exceptions.ChunkedEncodingError:
                continue
            if r.status_code >= 500:
                codes.add(Selector(r.text).css(".error::attr(data-error)").get())
        assert codes and codes <= {"internal_error", "bad_gateway", "service_unavailable"}
        # Outside the three front ends nothing fails.
        assert all(http.get(server.url + "/headers").status_code == 200 for _ in range(5))


def test_single_kind_truncates_every_response() -> None:
    with DemoServer(
        size="tiny", features=["soft_fail"], soft_fail_rate=1.0, soft_fail_kinds=["truncate"]
    ) as server:
        for path in ("/pc/feed", "/h5/api/post/p1", "/app/api/feed"):
            assert _outcome(server.url + path) == "truncate"


def test_soft_fail_rate_is_seeded(http: requests.Session) -> None:
    runs = []
    for _ in range(2):
        with DemoServer(
            size="tiny", features=["soft_fail"], soft_fail_rate=0.3, soft_fail_kinds=["error"],
            soft_fail_seed=5,
        ) as server:  # fmt: skip
            runs.append([http.get(server.url + "/h5/api/feed").status_code for _ in range(30)])
    assert runs[0] == runs[1] and 200 in runs[0] and any(c >= 500 for c in runs[0])
