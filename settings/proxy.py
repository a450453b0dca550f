"""Tunables of the proxy pool, read from `CHAINCRAWL_PROXY_*` environment variables.

Kept apart from `config.Settings` so the proxy subsystem can grow options without touching the
shared settings class; the key prefix and Redis URL still come from there.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from settings.base import ChaincrawlSettings


class ProxySettings(ChaincrawlSettings):
    """Defaults follow haipproxy (score > 6, validated within 2 min, answers within 10 s)."""

    model_config = SettingsConfigDict(env_prefix="CHAINCRAWL_PROXY_")

    # --- scoring -------------------------------------------------------------------------
    initial_score: float = Field(
        5.0, description="Score of a proxy admitted by its first validation."
    )
    smooth_above: float = Field(
        10.0, description="From this score on, a success adds round(10/score, 2)."
    )

    # --- selection ---------------------------------------------------------------------------
    lowest_score: float = Field(
        6.0, description="Selection keeps proxies scoring strictly above this."
    )
    ttl_validated: float = Field(120.0, description="...and validated within this many seconds...")
    longest_response: float = Field(10.0, description="...and answering within this many seconds.")
    client_pool_size: int = Field(
        10,
        description="Client pool length; fewer than twice this many qualifying relaxes selection.",
    )
    fast_response: float = Field(
        5.0, description="Greedy strategy: keep a proxy answering faster than this."
    )
    mode: str = Field("channel", description="Provider mode: channel (exclusive), robin or greedy.")

    # --- channel pools ---------------------------------------------------------------------
    lease_ttl: float = Field(
        120.0, description="Seconds a checked-out proxy stays lent before it is reclaimed."
    )
    ban_ttl: float = Field(
        3600.0, description="Seconds a site-banned proxy is kept out of that channel."
    )
    throttle_ttl: float = Field(
        60.0,
        description="Seconds a 429 without Retry-After benches a proxy in that channel "
        "(an answer's Retry-After wins, capped by ban_ttl).",
    )
    refill_batch: int = Field(50, description="Most proxies one refill copies into a channel.")
    refill_below: int = Field(5, description="Refill a channel when fewer idle proxies remain.")
    refill_interval: float = Field(
        1.0, description="Least seconds between watermark refills per process."
    )

    # --- validation ----------------------------------------------------------------------------
    check_url: str = Field(
        "http://127.0.0.1:8000/headers",
        description="Echo page answering JSON {remote_addr, headers}: spots transparent proxies.",
    )
    check_timeout: float = Field(10.0, description="Timeout of one validation request.")
    validate_batch: int = Field(200, description="Most proxies one validation run checks.")
    validate_workers: int = Field(16, description="Concurrent validation requests per run.")
    revalidate_after: float = Field(
        60.0, description="Re-validate proxies last validated this long ago."
    )
    max_unvalidated: float = Field(
        1800.0, description="Drop proxies that have not passed a validation for this long."
    )
    site_checks: dict[str, str] = Field(
        default_factory=dict, description='JSON {"site": "url"}: per-site validator pages.'
    )
    site_check_batch: int = Field(20, description="Channel members one per-site validation checks.")

    # --- harvesting ------------------------------------------------------------------------
    sources: list[str] = Field(
        default_factory=list,
        description='JSON list of specs: "page:<url with {page}>", "file:<path>", "api:<url>".',
    )
    harvest_minutes: float = Field(10.0, description="Beat: harvest every N minutes.")
    validate_seconds: float = Field(30.0, description="Beat: validate every M seconds.")


def get_proxy_settings() -> ProxySettings:
    """This process's proxy settings, read on first use."""
    return ProxySettings.current()


def reset_proxy_settings() -> None:
    """Forget the cached settings (tests that change the environment call this)."""
    ProxySettings.forget()
