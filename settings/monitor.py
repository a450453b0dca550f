"""Settings of `control.sh monitor`: the Prometheus exporter and the alert rules.

Kept apart from `config.Settings` like the proxy ones: `CHAINCRAWL_MONITOR_*` for the
exporter (monitor/exporter.py), `CHAINCRAWL_ALERTS_*` for the alert evaluator
(monitor/alerts.py), whose values override the rules file's top-level keys.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from settings.base import ChaincrawlSettings


class MonitorSettings(ChaincrawlSettings):
    """`CHAINCRAWL_MONITOR_*`: where /metrics listens and who may read it."""

    model_config = SettingsConfigDict(env_prefix="CHAINCRAWL_MONITOR_")

    address: str = Field("127.0.0.1", description="Where /metrics listens; not loopback => auth.")
    port: int = Field(9808, description="Port of /metrics.")
    user: str = Field("metrics", description="Basic-auth user.")
    password: str = Field("", description="Basic-auth password; generated into var/ if needed.")
    runs_limit: int = Field(50, description="Active runs exported per scrape (label cardinality).")
    series_interval: float = Field(
        60.0,
        gt=0,
        description="Seconds between two points of the report's time series (up to 10 minutes "
        "while no process of the fleet runs a task: [monitoring](monitoring.md)).",
    )
    series_points: int = Field(
        1440, gt=0, description="Points a time series keeps (per run, and the fleet's)."
    )


class AlertSettings(ChaincrawlSettings):
    """`CHAINCRAWL_ALERTS_*`: they override the YAML file's top-level keys."""

    model_config = SettingsConfigDict(env_prefix="CHAINCRAWL_ALERTS_")

    file: str = Field("", description="Rules file; default alerts.yaml at the project root.")
    rules: str = Field("", description="Inline YAML (a list of rules or a whole config).")
    webhook: str = Field("", description="URL notifications are POSTed to (JSON).")
    interval: str = Field("", description="Seconds (or 15s, 1m) between evaluations.")
    enabled: bool = Field(True, description="Whether `control.sh monitor` evaluates alert rules.")


def get_monitor_settings() -> MonitorSettings:
    """This process's exporter settings, read on first use."""
    return MonitorSettings.current()


def reset_monitor_settings() -> None:
    """Forget the cached exporter and alert settings (tests that change the environment)."""
    MonitorSettings.forget()
    AlertSettings.forget()


def get_alert_settings() -> AlertSettings:
    """This process's alert settings, read on first use."""
    return AlertSettings.current()
