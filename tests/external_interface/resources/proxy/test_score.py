"""Score arithmetic (haipproxy's rule), its Lua twin in Redis, addresses and outcome classes."""

from __future__ import annotations

import itertools
import logging
from typing import cast

import pytest
import requests

import exceptions as cc
from external_interface.resources.proxy.models import (
    Event,
    ProxyAddress,
    classify,
    next_score,
    redact,
)
from external_interface.resources.proxy.pool import GlobalPool
from tests.external_interface.stores import rds_on_both_stores  # noqa: F401 - fixture `rds`


# --- the pure rule --------------------------------------------------------------------------
def test_success_adds_one_below_ten() -> None:
    assert next_score(5, Event.SUCCESS) == 6
    assert next_score(9, Event.SUCCESS) == 10
    assert next_score(9.5, Event.SUCCESS) == 10.5


def test_success_from_ten_on_adds_round_ten_over_score() -> None:
    assert next_score(10, Event.SUCCESS) == 11  # round(10/10, 2) = 1
    assert next_score(11, Event.SUCCESS) == 11 + 0.91  # round(0.909..., 2)
    assert next_score(12.5, Event.SUCCESS) == 12.5 + 0.8
    assert next_score(16, Event.SUCCESS) == 16 + 0.62  # 0.625 rounds half to even
    assert next_score(40, Event.SUCCESS) == 40.25


def test_growth_slows_down_above_ten() -> None:
    score, gains = 5.0, []
    for _ in range(40):
        new = next_score(score, Event.SUCCESS)
        assert new is not None
        gains.append(new - score)
        score = new
    assert gains[:5] == [1, 1, 1, 1, 1]
    assert all(a >= b for a, b in itertools.pairwise(gains[5:]))
    assert score < 30


def test_timeout_subtracts_one_and_zero_removes() -> None:
    assert next_score(5, Event.TIMEOUT) == 4
    assert next_score(1.5, Event.TIMEOUT) == 0.5
    assert next_score(1, Event.TIMEOUT) is None
    assert next_score(0.5, Event.TIMEOUT) is None


def test_refused_removes_and_neutral_keeps() -> None:
    assert next_score(50, Event.DEAD) is None
    assert next_score(7, Event.NEUTRAL) == 7
    assert next_score(7, Event.BANNED) == 7


# --- the Lua twin, on a real Redis ------------------------------------------------------------
def _admit(pool: GlobalPool, pid: str = "127.0.0.9:8080") -> str:
    pool.admit(ProxyAddress.parse(pid), elapsed=0.1)
    return pid


def test_new_proxy_scores_five(pool: GlobalPool) -> None:
    pid = _admit(pool)
    assert pool.score(pid) == 5


def test_redis_follows_the_rule_exactly(pool: GlobalPool) -> None:
    pid = _admit(pool)
    expected = 5.0
    for _ in range(60):
        res = pool.record(pid, Event.SUCCESS, elapsed=0.2)
        expected = cast(float, next_score(expected, Event.SUCCESS))  # never None (removal) here
        assert res.state == "updated"
        assert res.score == expected
        assert pool.score(pid) == expected
    for _ in range(3):
        expected = cast(float, next_score(expected, Event.TIMEOUT))
        assert pool.record(pid, Event.TIMEOUT, elapsed=2.0).score == expected


def test_timeouts_remove_at_zero(pool: GlobalPool) -> None:
    pid = _admit(pool)
    for left in (4, 3, 2, 1):
        assert pool.record(pid, Event.TIMEOUT).score == left
    assert pool.record(pid, Event.TIMEOUT).state == "removed"
    assert pid not in pool
    assert pool.info(pid) is None
    assert pool.urls([pid]) == {}
    assert pool.stats()["removed_timeout"] == 1


def test_refused_removes_at_once(pool: GlobalPool) -> None:
    pid = _admit(pool)
    for _ in range(8):
        pool.record(pid, Event.SUCCESS)
    assert pool.record(pid, Event.DEAD).state == "removed"
    assert len(pool) == 0


def test_feedback_never_resurrects(pool: GlobalPool) -> None:
    pid = _admit(pool)
    pool.remove(pid)
    assert pool.record(pid, Event.SUCCESS, elapsed=0.1).state == "absent"
    assert pid not in pool
    assert pool.info(pid) is None


def test_success_updates_indexes(pool: GlobalPool) -> None:
    pid = _admit(pool)
    pool.record(pid, Event.SUCCESS, elapsed=0.75, now=1234.5)
    info = pool.info(pid)
    assert info is not None
    assert (info.score, info.checked, info.speed) == (6, 1234.5, 0.75)
    # a timeout updates the speed (a lower bound) but not the validation time
    pool.record(pid, Event.TIMEOUT, elapsed=9.0, now=2000.0)
    info = pool.info(pid)
    assert info is not None
    assert (info.score, info.checked, info.speed) == (5, 1234.5, 9.0)


def test_concurrent_feedback_loses_no_update(pool: GlobalPool) -> None:
    from concurrent.futures import ThreadPoolExecutor

    pid = _admit(pool)
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda _: pool.record(pid, Event.SUCCESS), range(4)))
    assert pool.score(pid) == 9


# --- addresses and credentials ---------------------------------------------------------------
def test_address_parsing_and_redaction() -> None:
    a = ProxyAddress.parse("http://us%40er:p%3Ass@10.1.2.3:3128")
    assert (a.host, a.port, a.username, a.password) == ("10.1.2.3", 3128, "us@er", "p:ss")
    assert a.id == "10.1.2.3:3128"
    assert a.redacted == "http://***@10.1.2.3:3128"
    assert ProxyAddress.parse(a.url) == a
    assert "p:ss" not in repr(a) and "p:ss" not in str(a) and "p%3Ass" not in repr(a)
    assert ProxyAddress.parse("1.2.3.4:80").url == "http://1.2.3.4:80"
    assert redact("http://u:secret@1.2.3.4:80") == "http://***@1.2.3.4:80"
    with pytest.raises(ValueError) as err:
        ProxyAddress.parse("http://u:secret@nohostport")
    assert "secret" not in str(err.value)
    with pytest.raises(ValueError):
        ProxyAddress.parse("socks5://1.2.3.4:1080")


def test_credentials_stay_out_of_ids_and_logs(
    pool: GlobalPool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = "http://crawler:hunter2@127.0.0.77:3128"
    assert pool.add_raw([url]) == 1
    [addr] = pool.take_raw(10)
    assert addr.url == url
    pool.admit(addr, 0.1)
    assert pool.ids() == ["127.0.0.77:3128"]
    pool.record(addr.id, Event.DEAD)
    assert "127.0.0.77:3128" in caplog.text
    assert "hunter2" not in caplog.text


# --- outcome classes -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "error", "event"),
    [
        (200, None, Event.SUCCESS),
        (302, None, Event.SUCCESS),
        (404, None, Event.NEUTRAL),
        (500, None, Event.NEUTRAL),
        (403, None, Event.BANNED),
        (429, None, Event.BANNED),
        (407, None, Event.DEAD),
        (None, cc.FetchTimeout("t"), Event.TIMEOUT),
        (None, cc.ProxyError("p"), Event.DEAD),
        (None, cc.ConnectError("c"), Event.DEAD),
        (None, cc.CaptchaRequired("c"), Event.BANNED),
        (403, cc.Forbidden("f", 403), Event.BANNED),
        (None, cc.ServerError("s", 502), Event.NEUTRAL),
        (None, cc.ParseError("p"), Event.NEUTRAL),
        (None, requests.exceptions.ProxyError("p"), Event.DEAD),
        (None, requests.exceptions.ReadTimeout("r"), Event.TIMEOUT),
        (None, requests.exceptions.ConnectTimeout("r"), Event.TIMEOUT),
        (None, ConnectionRefusedError(), Event.DEAD),
        (None, TimeoutError(), Event.TIMEOUT),
    ],
)
def test_classify(status: int | None, error: BaseException | None, event: Event) -> None:
    assert classify(status, error) is event
