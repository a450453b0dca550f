"""User agents per platform family with rotation; each one passes the demo's UA rules."""

from __future__ import annotations

from collections import Counter

import pytest
import requests

from demo.guards import ua_ok
from demo.testing import DemoServer
from external_interface.resources.base import OutgoingRequest
from external_interface.resources.user_agent import (
    GENERIC,
    UserAgentProvider,
    agents_for,
    family,
)
from sites.demo.production import profile  # noqa: F401 - registers the demo's user agents


def test_platform_families() -> None:
    assert [family(p) for p in ("pc", "web", "h5", "m", "app", "phone_app", "common", "captcha")] == [
        "pc", "pc", "h5", "h5", "app", "app", "pc", "pc",
    ]  # fmt: skip


@pytest.mark.parametrize("front", ["pc", "h5", "app"])
def test_every_demo_agent_passes_the_demo_rules(front: str) -> None:
    agents = agents_for("demo", front)
    assert len(agents) >= 3
    assert all(ua_ok(front, ua) for ua in agents)
    if front == "app":
        assert agents != GENERIC["app"]  # the demo's own DemoApp/<version> format


def test_rotation_cycles_through_all_agents() -> None:
    prov = UserAgentProvider("demo", "h5")
    n = len(agents_for("demo", "h5"))
    seen: Counter[str] = Counter()
    for _ in range(3 * n):
        req = OutgoingRequest("GET", "http://x/")
        prov.prepare(req, None)  # type: ignore[arg-type]
        seen[req.headers["User-Agent"]] += 1
    assert len(seen) == n and set(seen.values()) == {3}


def test_an_existing_user_agent_is_kept() -> None:
    req = OutgoingRequest("GET", "http://x/", headers={"user-agent": "DemoApp/1.0 (device's own)"})
    UserAgentProvider("demo", "app").prepare(req, None)  # type: ignore[arg-type]
    assert req.headers == {"user-agent": "DemoApp/1.0 (device's own)"}


def test_environment_overrides_a_sites_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAINCRAWL_UA_SHOP_PC", '["Mozilla/5.0 Shop/1", "Mozilla/5.0 Shop/2"]')
    assert agents_for("shop", "pc") == ("Mozilla/5.0 Shop/1", "Mozilla/5.0 Shop/2")
    assert agents_for("other", "pc") == GENERIC["pc"]


def test_demo_server_accepts_the_agents_of_each_front() -> None:
    paths = {"pc": "/pc/feed", "h5": "/h5/api/feed", "app": "/app/api/feed"}
    with DemoServer(size="tiny", features=["ua_check"]) as demo:
        for front, path in paths.items():
            prov = UserAgentProvider("demo", front)
            for _ in agents_for("demo", front):
                req = OutgoingRequest("GET", demo.url + path)
                prov.prepare(req, None)  # type: ignore[arg-type]
                assert requests.get(req.url, headers=req.headers, timeout=5).status_code == 200
            # the wrong family is refused: the rule is real
            other = "h5" if front != "h5" else "pc"
            ua = agents_for("demo", other)[0]
            r = requests.get(demo.url + path, headers={"User-Agent": ua}, timeout=5)
            assert r.status_code == 403
        assert demo.stats()["rejections"] == {"bad_user_agent": 3}
