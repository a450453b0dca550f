"""The demo's cookie production steps and the cookie provider against a real DemoServer:
captcha -> recognize -> login -> pool, a wrong captcha, refused accounts, and a session ban
detected from the login wall. The steps run in-process with the real providers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
import redis

from config import get_settings
from demo.testing import DemoServer
from exceptions import ConfigError, LoginRequired
from external_interface.resources.captcha import captcha_stats
from external_interface.resources.pool import Pool
from sites.demo.production.cookies import CaptchaChallenge
from sites.production import PoolEntry
from tests.resources_site.helpers import fetcher, private_env, run_online

NO_PRODUCTION = '{"low_water": 0}'  # these tests produce by hand; no chain runs


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoServer]:
    with DemoServer(size="tiny", features=["login", "ua_check"], session_ban_rpm=3) as server:
        yield server


@pytest.fixture
def env(demo: DemoServer, redis_url: str, key_prefix: str) -> Iterator[None]:
    with private_env(
        CHAINCRAWL_REDIS_URL=redis_url,
        CHAINCRAWL_KEY_PREFIX=key_prefix,
        DEMO_BASE_URL=demo.url,
        CHAINCRAWL_POOL_COOKIE_DEMO=NO_PRODUCTION,
    ):
        yield


def produce_cookie() -> str:
    """The production chain's four steps, each fed by the previous step's item."""
    (challenge,), _ = run_online("demo.captcha.download", {"slot": 0})
    (solution,), _ = run_online("demo.captcha.recognize", challenge.model_dump())
    (ticket,), _ = run_online("demo.login", solution.model_dump())
    (entry,), _ = run_online("demo.cookie.add", ticket.model_dump())
    assert isinstance(entry, PoolEntry)
    assert entry.pool == "cookie:demo"
    return entry.member


def test_production_steps_put_a_working_session_into_the_pool(
    env: None, demo: DemoServer, rds: redis.Redis, key_prefix: str
) -> None:
    before = demo.stats()["logins"]["ok"]
    member = produce_cookie()
    pool = Pool("cookie", "demo")
    assert pool.ids() == [member]
    raw = cast(bytes, rds.hget(pool.key_for("secret", member), member))
    assert b"session" not in raw  # sealed at rest
    assert '"session"' in pool.sealer.open(raw)
    assert demo.stats()["logins"]["ok"] == before + 1
    assert captcha_stats(rds, key_prefix, "demo") == {"solved": 1, "accepted": 1}
    # the login did not leave its session in the fetcher's cookie jar
    assert len(fetcher().session().cookies) == 0
    # and the session reads comments
    items, _ = run_online("demo.pc.comment", {"post_id": "p1"})
    assert len(items) == demo.config.comments_per_post
    assert pool.uses(member) == 1 and pool.score(member) == 6


def test_a_banned_session_is_detected_retired_and_reported(
    env: None, demo: DemoServer, rds: redis.Redis, key_prefix: str
) -> None:
    member = produce_cookie()
    bans_before = demo.stats()["bans"]["session_bans_total"]
    for front in ("pc", "h5", "pc"):  # session_ban_rpm=3: three comment reads are fine
        items, _ = run_online(f"demo.{front}.comment", {"post_id": "p2"})
        assert len(items) == demo.config.comments_per_post
    with pytest.raises(LoginRequired):
        run_online("demo.pc.comment", {"post_id": "p2"})  # the 200 login-wall page
    assert demo.stats()["bans"]["session_bans_total"] == bans_before + 1
    pool = Pool("cookie", "demo")
    assert member not in pool and pool.retired() == [member]
    s = pool.stats()
    assert (s["size"], s["bans"], s["produced"], s["retired_by"]) == (0, 1, 1, {"banned": 1})


def test_a_rejected_captcha_is_replaced_by_a_fresh_one(
    env: None, demo: DemoServer, rds: redis.Redis, key_prefix: str
) -> None:
    (challenge,), _ = run_online("demo.captcha.download", {"slot": 0})
    assert isinstance(challenge, CaptchaChallenge)
    before = demo.stats()["logins"]
    (ticket,), _ = run_online("demo.login", {"captcha_id": challenge.captcha_id, "answer": "x"})
    after = demo.stats()["logins"]
    assert after["bad_captcha"] == before["bad_captcha"] + 1
    assert after["ok"] == before["ok"] + 1
    assert captcha_stats(rds, key_prefix, "demo") == {"rejected": 1, "solved": 1, "accepted": 1}
    (entry,), _ = run_online("demo.cookie.add", ticket.model_dump())
    assert isinstance(entry, PoolEntry)
    assert entry.member in Pool("cookie", "demo")


def test_a_refused_account_is_skipped(
    env: None, demo: DemoServer, rds: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAINCRAWL_ACCOUNTS_DEMO", "ghost:wrong-pass,demo2:pass-demo2")
    before = demo.stats()["logins"]
    produce_cookie()
    after = demo.stats()["logins"]
    assert after["bad_credentials"] == before["bad_credentials"] + 1
    assert after["ok"] == before["ok"] + 1
    assert rds.exists(f"{key_prefix}:accounts:demo:disabled:ghost")


def test_no_usable_account_fails_without_showing_the_password(
    env: None, demo: DemoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAINCRAWL_ACCOUNTS_DEMO", "ghost:hunter2-secret")
    (challenge,), _ = run_online("demo.captcha.download", {"slot": 0})
    (solution,), _ = run_online("demo.captcha.recognize", challenge.model_dump())
    with pytest.raises(ConfigError) as ei:
        run_online("demo.login", solution.model_dump())
    assert "hunter2" not in str(ei.value)


def test_accounts_from_a_file_under_var(
    env: None, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    from external_interface.resources.accounts import Accounts, load

    var = Path(str(tmp_path))
    (var / "accounts").mkdir()
    (var / "accounts" / "demo.txt").write_text(
        "# test accounts\ndemo5:pass-demo5\ndemo6:pass-demo6\n"
    )
    monkeypatch.delenv("CHAINCRAWL_ACCOUNTS_DEMO", raising=False)
    accts = load("demo", var)
    assert [a.username for a in accts] == ["demo5", "demo6"]
    assert "pass-demo5" not in repr(accts) and str(accts[0]) == "demo5"
    rr = Accounts("demo", accounts=accts)
    assert [rr.pick().username for _ in range(3)] == ["demo5", "demo6", "demo5"]
    assert get_settings().key_prefix  # the round robin lives under our private prefix
