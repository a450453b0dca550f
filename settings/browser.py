"""Settings of rendered pages (`CHAINCRAWL_BROWSER_*`): the browser pool, the per-site cap
on renders, and the captures failed pages leave in their dead letters.

Only the processes that render read them (external_interface/browser, the gate's render
scope, the dead-letter captures), so they live apart from the core `Settings`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from settings.base import ChaincrawlSettings


class BrowserSettings(ChaincrawlSettings):
    """The browser pool per worker process (docs/browser.md) and rendering's shared limits."""

    model_config = SettingsConfigDict(env_prefix="CHAINCRAWL_BROWSER_")

    # --- the pool (external_interface/browser) --------------------------------------------
    executable: str = Field(
        "",
        description="Chromium to render with (a path or a name on PATH); empty: the first of "
        "/usr/lib/chromium/chromium, chromium, chromium-browser, google-chrome-stable, "
        "google-chrome.",
    )
    contexts: int = Field(
        0,
        ge=0,
        description="Browser contexts (pages rendered at once) per worker process; 0: one per "
        "core, fewer when memory is short (one per 512 MB available), at most 8.",
    )
    context_pages: int = Field(
        100,
        ge=1,
        description="Pages a browser context renders before it is closed and a fresh one made.",
    )
    memory_mb: int = Field(
        0,
        ge=0,
        description="Ceiling on the browser's memory (sum of PSS of its processes); above it "
        "the browser is restarted once its pages finish. 0: 512 MB + 256 MB per context.",
    )
    timeout: float = Field(
        30.0,
        gt=0,
        description="Default deadline of one render in seconds (a free context, loading, "
        "waiting and actions included); a task's render never outlives the task's deadline.",
    )
    queue_wait: float = Field(
        5.0,
        ge=0,
        description="Longest a render waits for a free browser context; then the task is "
        "re-queued (ResourceUnavailable) instead of spending its deadline waiting.",
    )
    idle_close: float = Field(
        60.0,
        ge=0,
        description="Seconds without a render after which a worker process's browser (its "
        "driver, Playwright's Node.js server and Chromium) is closed; the next render starts "
        "it again (1-2 s). 0: kept open for the worker's life.",
    )
    block: str = Field(
        "image,font,media",
        description="Resource types aborted before they load (comma-separated Playwright "
        "resource types); empty blocks nothing and keeps the browser's HTTP cache.",
    )
    args: str = Field(
        "",
        description="Extra Chromium command-line switches, space-separated (e.g. `--lang=zh-CN`).",
    )

    # --- shared limits (scheduling/gate.py) -----------------------------------------------
    site_limit: str = Field(
        "4",
        description="Renders in flight per site across every worker (the `<site>.render` "
        "scope) unless CHAINCRAWL_LIMITS has an entry for that scope: a cap (`4`), a rate "
        "(`1/s`) or both (`1/s,4`); `off` for none. A rendered page costs the site and us "
        "far more than a fetch.",
    )

    # --- adaptive rendering (external_interface/fetch/adaptive.py) ------------------------
    adaptive_samples: int = Field(
        3,
        ge=1,
        description='`render="auto"` endpoints: pages of a URL pattern fetched and rendered '
        "both before it is decided (plain fetching only if every one gave the browser's "
        "items); also the agreeing samples in a row that take a rendered pattern back to "
        "plain fetching.",
    )
    adaptive_resample: int = Field(
        20,
        ge=0,
        description="Every Nth page of a decided URL pattern is fetched both ways again, so a "
        "page type that changed (static to rendered or back) is noticed; 0: never.",
    )
    adaptive_wait: Literal["load", "domcontentloaded", "networkidle", "commit"] = Field(
        "networkidle",
        description="What an adaptive render waits for (Playwright's wait_until: load, "
        "domcontentloaded, networkidle): the endpoint names no selector.",
    )
    adaptive_evidence: int = Field(
        20, ge=1, description="Samples kept per URL pattern as the decision's evidence."
    )

    # --- dead letters (monitor/deadletter.py) ---------------------------------------------
    captures: int = Field(
        200,
        ge=0,
        description="Screenshots and DOMs of failed pages kept under VAR_DIR/captures (the "
        "newest, one directory per dead letter); 0 keeps none.",
    )
    capture_max_kb: int = Field(
        2048,
        ge=1,
        description="Largest screenshot or DOM kept per dead letter, in KB (a longer DOM is "
        "cut; a larger screenshot is left out).",
    )


def get_browser_settings() -> BrowserSettings:
    """This process's browser settings, read on first use."""
    return BrowserSettings.current()
