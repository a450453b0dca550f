"""The settings classes (`config` and the `settings` package): one base, errors that name the
variable, the cached instances, and a configuration reference that stays true to the classes."""

from __future__ import annotations

import pytest

import config
from config import ChaincrawlSettings, Settings, get_settings, reset_settings
from exceptions import ConfigError
from settings import reference
from settings.proxy import ProxySettings, get_proxy_settings
from settings.storage import StorageSettings, get_storage_settings


def _subclasses(cls: type[object]) -> set[type]:
    out: set[type] = set()
    for sub in cls.__subclasses__():
        if sub.__module__ == "config" or sub.__module__.startswith("settings."):
            out |= {sub} | _subclasses(sub)
    return out


def test_every_settings_class_is_listed_and_described() -> None:
    assert _subclasses(ChaincrawlSettings) == set(config.settings_classes())
    for cls in config.settings_classes():
        undescribed = [n for n, f in cls.model_fields.items() if not f.description]
        assert undescribed == [], cls.__name__


def test_names_follow_the_prefix_or_the_aliases() -> None:
    assert Settings.env_names()["redis_url"] == ("CHAINCRAWL_REDIS_URL", "REDIS_URL")
    assert Settings.env_names()["max_retries"] == ("CHAINCRAWL_MAX_RETRIES",)
    assert ProxySettings.env_names()["ban_ttl"] == ("CHAINCRAWL_PROXY_BAN_TTL",)
    assert StorageSettings.env_names()["http_sink_url"] == ("CHAINCRAWL_HTTP_SINK_URL",)


def test_a_bad_json_value_is_an_error_naming_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("CHAINCRAWL_PROXY_SOURCES", '["page:http://127.0.0.1:1/{page}", oops')
    with pytest.raises(ConfigError) as err:
        ProxySettings()
    assert str(err.value).startswith("CHAINCRAWL_PROXY_SOURCES: not valid JSON")
    assert "oops" not in str(err.value)
    monkeypatch.setenv("CHAINCRAWL_PROXY_SOURCES", '["file:/tmp/proxies.txt"]')
    monkeypatch.setenv("CHAINCRAWL_PROXY_SITE_CHECKS", '{"demo": "http://127.0.0.1:1/"}')
    s = ProxySettings()
    assert s.sources == ["file:/tmp/proxies.txt"]
    assert s.site_checks == {"demo": "http://127.0.0.1:1/"}
    monkeypatch.setenv("CHAINCRAWL_PROXY_SITE_CHECKS", '["a list"]')
    with pytest.raises(ConfigError, match=r"^CHAINCRAWL_PROXY_SITE_CHECKS: .*dictionary"):
        ProxySettings()


def test_a_bad_value_names_the_variable_and_hides_the_value(monkeypatch) -> None:
    monkeypatch.setenv("CHAINCRAWL_HTTP_SINK_RETRIES", "three-secret")
    with pytest.raises(ConfigError) as err:
        StorageSettings()
    assert str(err.value).startswith("CHAINCRAWL_HTTP_SINK_RETRIES: ")
    assert "secret" not in str(err.value)
    assert isinstance(err.value, ValueError)  # as pydantic's own errors are
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("CHAINCRAWL_MAX_RETRIES", "x")
    monkeypatch.setenv("CHAINCRAWL_PIN_CORES", "sometimes")
    with pytest.raises(ConfigError) as err:
        Settings()
    assert str(err.value).startswith("CHAINCRAWL_MAX_RETRIES: ")
    assert "; CHAINCRAWL_PIN_CORES: " in str(err.value)


def test_an_empty_storage_variable_counts_as_unset(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CHAINCRAWL_HTTP_SINK_TIMEOUT", "")
    monkeypatch.setenv("CHAINCRAWL_JSONL_DIR", "")
    s = StorageSettings()
    assert s.http_sink_timeout == 10.0
    assert s.jsonl_root(tmp_path) == tmp_path / "items"
    monkeypatch.setenv("CHAINCRAWL_JSONL_DIR", str(tmp_path / "elsewhere"))
    assert StorageSettings().jsonl_root(tmp_path) == tmp_path / "elsewhere"


def test_from_environ_reads_only_the_mapping(monkeypatch) -> None:
    monkeypatch.setenv("CHAINCRAWL_MAX_RETRIES", "9")
    s = Settings.from_environ({"CHAINCRAWL_TASK_EVENTS": "yes", "REDIS_URL": "redis://h:1/2"})
    assert (s.max_retries, s.task_events, s.redis_url) == (4, True, "redis://h:1/2")
    assert Settings().max_retries == 9  # the process's environment again afterwards
    with pytest.raises(ConfigError, match=r"^CHAINCRAWL_BATCH: "):
        Settings.from_environ({"CHAINCRAWL_BATCH": "many"})


def test_instances_are_cached_until_reset(monkeypatch) -> None:
    reset_settings()
    first, proxy, storage = get_settings(), get_proxy_settings(), get_storage_settings()
    monkeypatch.setenv("CHAINCRAWL_MAX_RETRIES", "11")
    monkeypatch.setenv("CHAINCRAWL_PROXY_MODE", "robin")
    monkeypatch.setenv("CHAINCRAWL_OUTBOX_CLAIM_IDLE", "2")
    assert get_settings() is first and get_proxy_settings() is proxy
    assert get_storage_settings() is storage
    reset_settings()  # forgets every area's instance, not only the core one
    try:
        assert get_settings().max_retries == 11
        assert get_proxy_settings().mode == "robin"
        assert get_storage_settings().outbox_claim_idle == 2.0
    finally:
        monkeypatch.undo()
        reset_settings()


def test_the_written_reference_is_current() -> None:
    """docs/configuration.md and the README's tables (when it has the markers) are generated
    from the classes: `python -m settings.reference --write` after changing a field."""
    stale = "out of date: run `.venv/bin/python -m settings.reference --write`"
    assert reference.DOC.read_text() == reference.markdown(), f"docs/configuration.md {stale}"
    readme = reference.README.read_text()
    assert reference.with_readme_block(readme) == readme, f"README.md's settings table {stale}"
    stale = readme.replace(
        "| `CHAINCRAWL_KEY_PREFIX` | `cc` |", "| `CHAINCRAWL_KEY_PREFIX` | `xx` |"
    )
    if reference.BEGIN in readme:
        assert reference.with_readme_block(stale) == readme


def test_the_reference_lists_every_variable() -> None:
    text = reference.markdown()
    for cls in config.settings_classes():
        for names in cls.env_names().values():
            assert f"`{names[0]}`" in text
    assert "`CHAINCRAWL_UA_<SITE>_<PC\\|H5\\|APP>`" in text
    assert "| `CHAINCRAWL_VAR_DIR` | `var/` |" in text


def test_a_cluster_state_store_needs_a_broker_of_its_own(monkeypatch) -> None:
    cluster = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"
    monkeypatch.setenv("CHAINCRAWL_REDIS_URL", cluster)
    monkeypatch.delenv("CHAINCRAWL_BROKER_URL", raising=False)
    monkeypatch.delenv("BROKER_URL", raising=False)
    with pytest.raises(ConfigError, match=r"^CHAINCRAWL_REDIS_URL is a Redis Cluster.*BROKER_URL"):
        Settings()
    monkeypatch.setenv("CHAINCRAWL_BROKER_URL", "redis://127.0.0.1:6390/0")
    s = Settings()
    assert s.redis_url == cluster and s.redis_broker  # the sweeper works on the broker Redis
    monkeypatch.setenv("CHAINCRAWL_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
    assert not Settings().redis_broker  # the sweeper is off: RabbitMQ loses no message
    monkeypatch.setenv("CHAINCRAWL_BROKER_URL", "rediss+cluster://127.0.0.1:7000")
    with pytest.raises(ConfigError, match=r"^CHAINCRAWL_BROKER_URL: a Redis Cluster cannot be"):
        Settings()
    assert not config.is_redis_url(cluster) and config.is_cluster_url(cluster)
