"""Unit tests: DemoConfig presets, validation, file/env/CLI sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from demo.cli import config_from_args
from demo.config import FEATURES, SIZE_PRESETS, DemoConfig


def test_presets_fill_only_missing_counts() -> None:
    for name, (u, p, c) in SIZE_PRESETS.items():
        cfg = DemoConfig(size=name)
        assert (cfg.users, cfg.posts_per_user, cfg.comments_per_post) == (u, p, c)
    cfg = DemoConfig(size="tiny", users=9)
    assert (cfg.users, cfg.posts_per_user) == (9, 3)


def test_defaults_are_all_off() -> None:
    cfg = DemoConfig()
    assert cfg.features == frozenset() and cfg.size == "small"
    assert cfg.accounts["demo1"] == "pass-demo1" and len(cfg.accounts) == 20
    assert cfg.sign_key == "demo-sign-key" and cfg.sign_skew_s == 300


def test_validation() -> None:
    with pytest.raises(ValidationError):
        DemoConfig(features="rate_limit,bogus")
    with pytest.raises(ValidationError):
        DemoConfig(size="gigantic")
    with pytest.raises(ValidationError):
        DemoConfig(soft_fail_rate=1.5)
    assert DemoConfig(features="all").features == frozenset(FEATURES)
    assert DemoConfig(accounts="a:b,c:d:e").accounts == {"a": "b", "c": "d:e"}


def test_cli_file_and_env_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_SEED", "99")
    monkeypatch.setenv("DEMO_LATENCY_MS", "5")
    monkeypatch.setenv("DEMO_URL", "http://not-a-setting")  # unrelated DEMO_ vars are ignored
    path = tmp_path / "demo.yaml"
    path.write_text("size: medium\nlatency_ms: 7\nproxies: ['127.0.0.1:1', '127.0.0.1:2']\n")
    cfg, _ = config_from_args(
        ["--config", str(path), "--users", "3", "--features", "sign,login", "--access-log"]
    )
    assert cfg.seed == 99 and cfg.latency_ms == 7 and cfg.users == 3
    assert cfg.posts_per_user == SIZE_PRESETS["medium"][1]
    assert cfg.features == {"sign", "login"} and cfg.access_log is True
    assert cfg.proxies == ("127.0.0.1:1", "127.0.0.1:2")
    jpath = tmp_path / "demo.json"
    jpath.write_text(json.dumps(cfg.model_dump(mode="json")))
    assert DemoConfig.load(jpath) == cfg
    jpath.write_text(json.dumps({"nonsense": 1}))
    with pytest.raises(ValueError, match="unknown config keys"):
        DemoConfig.load(jpath)
