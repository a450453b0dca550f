"""settings/browser.py: what an adaptive render waits for is one of Playwright's events,
checked when the settings are read rather than at the first render."""

from __future__ import annotations

import pytest

from settings.base import SettingError
from settings.browser import BrowserSettings


def test_adaptive_wait_takes_playwrights_events() -> None:
    assert BrowserSettings(adaptive_wait="domcontentloaded").adaptive_wait == "domcontentloaded"
    assert BrowserSettings().adaptive_wait == "networkidle"


def test_a_misspelled_adaptive_wait_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHAINCRAWL_BROWSER_ADAPTIVE_WAIT", "network-idle")
    with pytest.raises(SettingError, match="CHAINCRAWL_BROWSER_ADAPTIVE_WAIT: Input should be"):
        BrowserSettings()
