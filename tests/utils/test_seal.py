"""Sealing secrets kept in Redis: keys from the settings (or a 0600 file made once, the same
for processes racing to make it), rotation by a new key in front, clear errors."""

from __future__ import annotations

import multiprocessing
import stat
import threading
from pathlib import Path

import pytest

from config import Settings
from exceptions import ConfigError, SecretUnreadable
from utils.seal import Sealer, get_sealer, key_id
from utils.secretfile import new_key, read_or_create


def test_seal_and_open_round_trip_with_a_fresh_iv_each_time() -> None:
    box = Sealer([new_key()])
    a, b = box.seal("sid=abc"), box.seal("sid=abc")
    assert a != b and b"abc" not in a
    assert box.open(a) == box.open(b) == "sid=abc"


def test_a_new_key_in_front_seals_and_the_old_one_still_opens() -> None:
    old, new = new_key(), new_key()
    before = Sealer([old]).seal("device-1")
    rotated = Sealer([new, old])
    assert rotated.open(before) == "device-1" and not rotated.is_current(before)
    resealed = rotated.reseal(before)
    assert rotated.is_current(resealed) and Sealer([new]).open(resealed) == "device-1"
    with pytest.raises(SecretUnreadable, match=r"device 7.*same CHAINCRAWL_SECRET_KEY"):
        Sealer([new]).open(before, "device 7")  # the old key dropped too early


def test_a_token_names_its_key_and_an_altered_one_is_refused() -> None:
    key = new_key()
    box = Sealer([key])
    token = box.seal("proxy-password")
    assert token.startswith(b"cc1" + bytes.fromhex(key_id(key)))
    assert box.key_ids == [key_id(key)]
    altered = token[:-1] + bytes([token[-1] ^ 1])
    with pytest.raises(SecretUnreadable, match="altered"):
        box.open(altered)
    with pytest.raises(SecretUnreadable, match=f"sealed with key {key_id(key)}"):
        Sealer([new_key()]).open(token)


def test_clear_text_and_bad_keys_are_refused_without_echoing_them() -> None:
    box = Sealer([new_key()])
    with pytest.raises(SecretUnreadable) as err:
        box.open(b'{"cookies": {"sid": "clear-secret"}}')
    assert "clear-secret" not in str(err.value) and "stored in clear" in str(err.value)
    with pytest.raises(ConfigError, match="not 32 bytes") as err2:
        Sealer(["hunter2-not-a-key"])
    assert "hunter2" not in str(err2.value)


def test_keys_come_from_the_setting_else_from_a_0600_file_made_once(tmp_path: Path) -> None:
    k1, k2 = new_key(), new_key()
    assert Settings(var_dir=tmp_path, secret_key=f"{k1}, {k2}").sealing_keys() == [k1, k2]
    s = Settings(var_dir=tmp_path)
    keys = s.sealing_keys()
    f = tmp_path / "secret.key"
    assert s.sealing_key_file == f and keys == [f.read_text().strip()]
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert Settings(var_dir=tmp_path).sealing_keys() == keys  # the same key next time
    assert get_sealer(s).open(get_sealer(Settings(var_dir=tmp_path)).seal("x")) == "x"
    other = tmp_path / "elsewhere" / "k"
    assert Settings(var_dir=tmp_path, secret_key_file=str(other)).sealing_keys() != keys
    assert other.exists()


def test_the_embedded_redis_password_is_derived_from_a_0600_file(tmp_path: Path) -> None:
    s = Settings(var_dir=tmp_path, redis_url="", embedded_redis_port=16400)
    pw = (tmp_path / "redis.secret").read_text().strip()
    assert len(pw) >= 32 and s.redis_url == f"redis://:{pw}@127.0.0.1:16400/0"
    assert s.broker_url == s.redis_url
    assert stat.S_IMODE((tmp_path / "redis.secret").stat().st_mode) == 0o600
    given = Settings(var_dir=tmp_path / "v2", redis_url="redis://:mine@10.0.0.5:6379/0")
    assert given.redis_url == "redis://:mine@10.0.0.5:6379/0"  # used as given
    assert not (tmp_path / "v2" / "redis.secret").exists()


def _make(path: str, q: multiprocessing.Queue, start: threading.Barrier) -> None:
    start.wait(120)  # all of them at once: the race is on the file, not on the start-up
    q.put(read_or_create(Path(path)))


def test_processes_racing_to_make_a_secret_all_get_the_same_one(tmp_path: Path) -> None:
    path = tmp_path / "raced.secret"
    # spawn, not fork: a fork of a test process with threads running (the test runner's own)
    # can inherit a lock held by one of them and hang
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    start = ctx.Barrier(8)
    procs = [ctx.Process(target=_make, args=(str(path), q, start)) for _ in range(8)]
    for p in procs:
        p.start()
    got = {q.get(timeout=180) for _ in procs}
    for p in procs:
        p.join(60)
    assert len(got) == 1 and got == {path.read_text().strip()}
    assert [p.name for p in tmp_path.iterdir()] == ["raced.secret"]  # no temporary left
    path.chmod(0o644)
    assert read_or_create(path) == got.pop() and stat.S_IMODE(path.stat().st_mode) == 0o600
