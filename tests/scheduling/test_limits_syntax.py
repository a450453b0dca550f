"""The CHAINCRAWL_LIMITS syntax: inline entries, YAML/JSON files, and errors that name the entry."""

from __future__ import annotations

import json

import pytest

from config import reset_settings
from exceptions import ConfigError
from scheduling.gate import RedisGate
from scheduling.limits import Limit, load_limits, parse_duration, parse_limits, parse_rate


@pytest.mark.parametrize(
    ("text", "per_second"),
    [("20/s", 20), ("600/m", 10), ("5/10s", 0.5), ("3600/h", 1), ("1/500ms", 2), ("2.5/s", 2.5),
     ("30/min", 0.5), ("7/ 2 s", 3.5)],
)  # fmt: skip
def test_rates(text: str, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize("text", ["20", "fast", "0/s", "20/d", "/s", "-1/s", "20/0s"])
def test_bad_rates(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_durations() -> None:
    assert parse_duration("30") == 30
    assert parse_duration("500ms") == 0.5
    assert parse_duration("2m") == 120
    assert parse_duration(1.5) == 1.5
    with pytest.raises(ValueError):
        parse_duration("0s")


def test_inline_entries() -> None:
    limits = parse_limits(
        "demo=20/s,8; demo.h5.feed=5/s ;other=max=3,lease=30s\n*=rate=10/s,burst=4"
    )
    assert limits == {
        "demo": Limit("demo", rate=20, max=8),
        "demo.h5.feed": Limit("demo.h5.feed", rate=5),
        "other": Limit("other", max=3, lease=30),
        "*": Limit("*", rate=10, burst=4),
    }
    assert parse_limits("  ") == {}
    assert parse_limits("# only a comment\n demo = 2/s  # polite\n") == {
        "demo": Limit("demo", rate=2)
    }


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("demo=20/s,8;demo.h5=fast", "entry 'demo.h5=fast': 'fast': expected a rate"),
        ("demo 20/s", "entry 'demo 20/s': expected scope=limits"),
        ("demo=20/s;demo=3", "scope 'demo' appears twice"),
        ("demo=20/s,10/s", "rate given twice"),
        ("demo=burst=3", "neither a rate"),
        ("demo=max=2,burst=3", "burst needs a rate"),
        ("demo=0", "max must be at least 1"),
        ("demo=20/s,speed=3", "unknown setting 'speed'"),
        ("de mo=20/s", "scope 'de mo' is not a site or task name"),
        ("demo=20/s,lease=soon", "'soon' is not a duration"),
    ],
)
def test_errors_name_the_entry(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_limits(text)
    assert "CHAINCRAWL_LIMITS" in str(err.value)
    assert needle in str(err.value)


def test_yaml_and_json_files(tmp_path) -> None:
    y = tmp_path / "limits.yaml"
    y.write_text(
        "limits:\n  demo: 20/s, 8\n  demo.h5.feed:\n    rate: 5/s\n    burst: 2\n  other: 4\n"
    )
    assert load_limits(str(y)) == {
        "demo": Limit("demo", rate=20, max=8),
        "demo.h5.feed": Limit("demo.h5.feed", rate=5, burst=2),
        "other": Limit("other", max=4),
    }
    j = tmp_path / "limits.json"
    j.write_text(json.dumps({"demo": {"max": 2, "lease": "1m"}}))
    assert load_limits(str(j)) == {"demo": Limit("demo", max=2, lease=60)}
    bad = tmp_path / "bad.yaml"
    bad.write_text("demo:\n  rate: quick\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: entry 'demo': 'quick' is not a rate"):
        load_limits(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_limits(str(tmp_path / "missing.yml"))


def test_scopes_a_task_passes() -> None:
    g = RedisGate(parse_limits("demo=20/s; demo.h5=4; demo.h5.feed=5/s; *=1/s"), client=_NoRedis())
    assert [lim.scope for lim in g.scopes("demo", "demo.h5.feed")] == [
        "demo",
        "demo.h5",
        "demo.h5.feed",
    ]
    assert [lim.scope for lim in g.scopes("demo", "demo.pc.home")] == ["demo"]
    # `*` applies to each site without an entry of its own, under that site's keys
    assert [(lim.scope, lim.rate) for lim in g.scopes("news", "news.app.list")] == [("news", 1)]


class _NoRedis:
    def register_script(self, script: str) -> None:
        return None


def test_workers_refuse_to_start_with_malformed_limits(monkeypatch) -> None:
    from scheduling.tasks import check_limits

    monkeypatch.setenv("CHAINCRAWL_LIMITS", "demo=20/s;demo.h5=fast")
    reset_settings()  # the settings are read once per process
    try:
        with pytest.raises(ConfigError, match=r"entry 'demo\.h5=fast'"):
            check_limits()
        monkeypatch.setenv("CHAINCRAWL_LIMITS", "demo=20/s")
        reset_settings()
        check_limits()
    finally:
        monkeypatch.undo()
        reset_settings()


def test_an_endpoint_outside_its_site_is_refused() -> None:
    """Every scope's keys carry its site's hash tag: an endpoint not named under its site
    would put one script's keys on two sites' slots of a Redis Cluster."""
    g = RedisGate(parse_limits("demo=20/s; news=1/s"), client=_NoRedis())
    with pytest.raises(ValueError, match=r"'news\.app\.list' is not of site 'demo'"):
        g.scopes("demo", "news.app.list")
