"""Browser identities: the user agent wins, and the target and every header follow it."""

from __future__ import annotations

import pytest

from external_interface.fetch.impersonate import TARGETS
from external_interface.fetch.profiles import (
    Profile,
    browser_headers,
    identity_for,
    own_identity,
    parse_user_agent,
    sec_ch_ua,
    target_for,
)
from external_interface.resources.user_agent import GENERIC

CHROME_124_WIN = GENERIC["pc"][0]
SAFARI_17_MAC = GENERIC["pc"][1]
FIREFOX_125_LINUX = GENERIC["pc"][2]
EDGE_124 = GENERIC["pc"][4]
IPHONE_17 = GENERIC["h5"][0]
PIXEL_CHROME_124 = GENERIC["h5"][1]
CRIOS = GENERIC["h5"][3]


@pytest.mark.parametrize(
    ("ua", "family", "version", "mobile", "os", "target"),
    [
        (CHROME_124_WIN, "chrome", 124, False, "Windows", "chrome124"),
        (SAFARI_17_MAC, "safari", 174, False, "macOS", "safari170"),
        (FIREFOX_125_LINUX, "firefox", 125, False, "Linux", "firefox133"),  # none older
        (EDGE_124, "edge", 124, False, "Windows", "chrome124"),  # Edge is Chromium's handshake
        (IPHONE_17, "safari", 174, True, "iOS", "safari172_ios"),
        (PIXEL_CHROME_124, "chrome", 124, True, "Android", "chrome99_android"),
        (CRIOS, "safari", 166, True, "iOS", "safari172_ios"),  # every iOS browser is WebKit
    ],
)  # fmt: skip
def test_a_user_agent_names_the_browser_and_its_closest_target(
    ua: str, family: str, version: int, mobile: bool, os: str, target: str
) -> None:
    ident = parse_user_agent(ua)
    assert ident is not None
    assert (ident.family, ident.version, ident.mobile, ident.os) == (family, version, mobile, os)
    assert target_for(ident, TARGETS) == target


def test_the_lent_user_agent_wins_over_the_profile() -> None:
    ident = identity_for(Profile("chrome", "desktop"), FIREFOX_125_LINUX)
    assert ident.family == "firefox" and ident.user_agent == FIREFOX_125_LINUX
    own = identity_for(Profile.parse("safari", "h5"), None)  # no lent agent: the profile's own
    assert (own.family, own.mobile, own.os) == ("safari", True, "iOS")
    assert "iPhone" in own.user_agent and target_for(own, TARGETS) == "safari180_ios"


def test_an_app_client_keeps_its_user_agent_and_sends_no_browser_header() -> None:
    ident = identity_for(Profile.parse("chrome", "app"), "okhttp/4.12.0")
    assert not ident.browser and target_for(ident, TARGETS).endswith("_android")
    names = [k.lower() for k, _ in browser_headers(ident, "GET", {"X-Device": "d1"})]
    assert names == ["x-device", "user-agent", "accept-encoding"]


def test_sec_ch_ua_is_chromium_s_own_brand_list() -> None:
    # as Chrome 131 and 146 send it (and curl_cffi's chrome131 and chrome146 targets)
    c131 = own_identity(Profile("chrome"))
    assert sec_ch_ua(c131) == '"Google Chrome";v="131", "Chromium";v="131", "Not_A Brand";v="24"'
    c146 = parse_user_agent(CHROME_124_WIN.replace("Chrome/124", "Chrome/146"))
    assert c146 is not None
    assert sec_ch_ua(c146) == '"Chromium";v="146", "Not-A.Brand";v="24", "Google Chrome";v="146"'
    edge = parse_user_agent(EDGE_124)
    assert edge is not None and '"Microsoft Edge";v="124"' in sec_ch_ua(edge)


def test_document_headers_follow_the_engine_s_order_and_the_user_agent() -> None:
    chrome = parse_user_agent(PIXEL_CHROME_124)
    assert chrome is not None
    pairs = browser_headers(chrome, "GET", {"User-Agent": PIXEL_CHROME_124, "X-Trace": "1"})
    names = [k.lower() for k, _ in pairs]
    assert names[:5] == ["sec-ch-ua", "sec-ch-ua-mobile", "sec-ch-ua-platform",
                         "upgrade-insecure-requests", "user-agent"]  # fmt: skip
    assert names[-1] == "x-trace"  # a header the engine does not know goes last
    got = dict((k.lower(), v) for k, v in pairs)
    assert got["sec-ch-ua-mobile"] == "?1" and got["sec-ch-ua-platform"] == '"Android"'
    assert got["sec-fetch-mode"] == "navigate" and got["user-agent"] == PIXEL_CHROME_124
    firefox = parse_user_agent(FIREFOX_125_LINUX)
    assert firefox is not None
    names = [k.lower() for k, _ in browser_headers(firefox, "GET", None)]
    assert names[0] == "user-agent" and "sec-ch-ua" not in names and names[-1] == "te"


def test_an_api_call_carries_a_script_s_headers_and_keeps_its_own_accept() -> None:
    safari = parse_user_agent(IPHONE_17)
    assert safari is not None
    got = dict((k.lower(), v) for k, v in
               browser_headers(safari, "GET", {"Accept": "application/json"}))  # fmt: skip
    assert got["accept"] == "application/json" and got["sec-fetch-mode"] == "cors"
    assert "upgrade-insecure-requests" not in got and "sec-fetch-user" not in got


def test_a_bad_profile_is_named() -> None:
    with pytest.raises(ValueError, match="unknown browser profile 'opera'"):
        Profile.parse("opera")
    with pytest.raises(ValueError, match="unknown form 'tv'"):
        Profile.parse("chrome/tv")
    assert Profile.parse("firefox", "h5") == Profile("firefox", "mobile")
    assert Profile.parse("", "app") == Profile("chrome", "app")
