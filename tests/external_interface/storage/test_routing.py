"""The storage facade: key sanitising, per-type routing, the sink registry."""

from __future__ import annotations

from typing import Any

import pytest

from config import Settings
from exceptions import ConfigError
from external_interface.storage import routing as storage
from external_interface.storage.routing import (
    Origin,
    PermanentSinkError,
    Policies,
    SinkRouter,
    build_sinks,
    entry_version,
    key_values,
    restore_keys,
    safe_name,
    sanitize_keys,
)
from settings.storage import reset_storage_settings
from utils.registry import UnknownNameError


class MemorySink:
    def __init__(self, name: str) -> None:
        self.name = name
        self.writes: list[tuple[str, list[dict[str, Any]]]] = []

    def write(self, item_type, key_fields, items, *, origins=None) -> None:
        self.writes.append((item_type, items))

    def close(self) -> None:
        pass


def test_sanitize_keys_recursively_and_reversibly() -> None:
    hostile = {
        "$where": "sleep(1000)",
        "a.b": 1,
        "ok$": 2,
        "nul\x00": 3,
        "nested": {"$gt": {"c.d": [{"$x": 1, "y": [{"$$z": 2}]}]}},
        "value": "$not.a.key",
    }
    clean = sanitize_keys(hostile)
    assert set(clean) == {"＄where", "a．b", "ok$", "nul␀", "nested", "value"}  # noqa: RUF001
    assert clean["nested"] == {"＄gt": {"c．d": [{"＄x": 1, "y": [{"＄$z": 2}]}]}}  # noqa: RUF001
    assert clean["value"] == "$not.a.key"  # values are data, never touched
    assert hostile["nested"] == {"$gt": {"c.d": [{"$x": 1, "y": [{"$$z": 2}]}]}}  # not mutated

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                assert not k.startswith("$") and "." not in k and "\x00" not in k
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(clean)
    assert restore_keys(clean) == hostile


def test_safe_name_and_entry_version() -> None:
    assert safe_name("demo.post") == "demo.post"
    assert "/" not in safe_name("../../etc/passwd")
    assert not safe_name("../x").startswith(".")
    assert entry_version("1700000000000-2") > entry_version("1700000000000-1")
    assert entry_version("1700000000001-0") > entry_version("1700000000000-999")
    assert Origin("5-1").version == entry_version(b"5-1")
    assert Origin().version is None


def test_key_values_rejects_missing_keys() -> None:
    assert key_values({"a": 1, "b": "x"}, ["b", "a"]) == ("x", 1)
    with pytest.raises(PermanentSinkError):
        key_values({"a": 1}, ["b"])
    with pytest.raises(PermanentSinkError):
        key_values({"a": None}, ["a"])


def test_policies_exact_glob_and_env() -> None:
    p = Policies()
    p.set("demo.*", sinks=("jsonl",))
    p.set("demo.post", track=("likes",))
    assert p.for_type("demo.post").track == ("likes",)
    assert p.for_type("demo.post").sinks is None  # exact rule wins over the glob
    assert p.for_type("demo.user").sinks == ("jsonl",)
    assert p.for_type("shop.item").sinks is None
    p.update_from_env(
        {
            "CHAINCRAWL_SINK_ROUTES": "demo.post=jsonl, mongo ; shop.*=http",
            "CHAINCRAWL_TRACK_HISTORY": "demo.post=likes,stats.views",
        }
    )
    assert p.for_type("demo.post").sinks == ("jsonl", "mongo")
    assert p.for_type("demo.post").track == ("likes", "stats.views")
    assert p.for_type("shop.x").sinks == ("http",)
    with pytest.raises(ConfigError):
        Policies().update_from_env({"CHAINCRAWL_SINK_ROUTES": "nonsense"})
    with pytest.raises(ConfigError):  # items must go somewhere
        Policies().update_from_env({"CHAINCRAWL_SINK_ROUTES": "demo.post="})


def test_router_sends_each_type_to_its_sinks() -> None:
    a, b = MemorySink("a"), MemorySink("b")
    policies = Policies()
    policies.set("special", sinks=("b",))
    router = SinkRouter({"a": a, "b": b}, ["a"], policies)
    router.write("plain", ["id"], [{"id": 1}])
    router.write("special", ["id"], [{"id": 2}])
    assert a.writes == [("plain", [{"id": 1}])]
    assert b.writes == [("special", [{"id": 2}])]
    policies.set("broken", sinks=("nope",))
    with pytest.raises(ConfigError):
        router.for_type("broken")


def test_build_sinks_from_settings(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CHAINCRAWL_SINK_ROUTES", "demo.both=jsonl,memo")
    reset_storage_settings()  # read once per process
    storage.sink_registry.add("memo", lambda settings, policies: MemorySink("memo"))
    try:
        router = build_sinks(Settings(var_dir=tmp_path, sinks="jsonl"))
        assert [s.name for s in router.for_type("demo.post")] == ["jsonl"]
        assert [s.name for s in router.for_type("demo.both")] == ["jsonl", "memo"]
        router.close()
        with pytest.raises(UnknownNameError, match="did you mean 'jsonl'"):
            build_sinks(Settings(var_dir=tmp_path, sinks="jsnol"))
        with pytest.raises(ConfigError):
            build_sinks(Settings(var_dir=tmp_path, sinks=" , "))
    finally:
        storage.sink_registry.remove("memo")
        monkeypatch.undo()
        reset_storage_settings()


def test_check_sinks_names_the_setting_of_an_unknown_sink(tmp_path, monkeypatch) -> None:
    """What `start` and `config` say before a worker's drainer fails to build its sinks (and
    stores nothing): the variable, the name and its nearest; nothing is built."""
    storage.check_sinks(Settings(var_dir=tmp_path, sinks="jsonl"), Policies())
    with pytest.raises(
        ConfigError, match=r"^CHAINCRAWL_SINKS: unknown sink 'jsnol'; did you mean 'jsonl'"
    ):
        storage.check_sinks(Settings(var_dir=tmp_path, sinks="jsonl,jsnol"), Policies())
    with pytest.raises(ConfigError, match="CHAINCRAWL_SINKS is empty"):
        storage.check_sinks(Settings(var_dir=tmp_path, sinks=" , "), Policies())
    monkeypatch.setenv("CHAINCRAWL_SINK_ROUTES", "jobs.*=jsonl,mongoo")
    reset_storage_settings()
    try:
        with pytest.raises(
            ConfigError, match=r"per-type sink rule .*'mongoo'; did you mean 'mongo'"
        ):
            storage.check_sinks(Settings(var_dir=tmp_path, sinks="jsonl"), Policies())
    finally:
        monkeypatch.undo()
        reset_storage_settings()
    assert not (tmp_path / "items").exists()  # nothing built


def test_each_sink_is_named_by_a_path_that_resolves() -> None:
    names = storage.sink_registry.names()
    assert names == ["http", "jsonl", "kafka", "mongo", "postgres"]
    for name in names:
        plugin = storage.sink_registry.get(name)
        assert isinstance(plugin, storage.SinkPlugin)
        cls = plugin.load()  # its client library is imported only when the sink is built
        assert cls.name == name and callable(cls.from_settings)
