"""The adaptive decisions in a real Redis: learning, deciding, re-sampling, changing back."""

from __future__ import annotations

import pytest
import redis

from external_interface.fetch.adaptive import (
    HTTP,
    LEARNING,
    RENDER,
    SAMPLE,
    AdaptiveStore,
    Sample,
    fingerprint,
    url_pattern,
)
from settings.browser import BrowserSettings

EP, PAT = "shop.pc.list", "/list?page"


@pytest.fixture
def store(rds: redis.Redis, key_prefix: str) -> AdaptiveStore:
    return AdaptiveStore(rds, key_prefix, BrowserSettings(adaptive_samples=2, adaptive_resample=4))


def sample(same: bool, items: int = 3) -> Sample:
    return Sample("http://x/list?page=1", same, items if same else 0, items, 0 if same else 3)


@pytest.mark.parametrize(
    ("url", "pattern"),
    [("https://s.example/mix/post/p12", "/mix/post/*"),
     ("https://s.example/mix/feed?page=3&sort=new", "/mix/feed?page&sort"),
     ("https://s.example/", "/"), ("https://s.example/a/b", "/a/b")],
)  # fmt: skip
def test_url_patterns(url: str, pattern: str) -> None:
    assert url_pattern(url) == pattern


def test_outputs_compare_by_content_not_order() -> None:
    class It:
        item_type = "t"

        def __init__(self, **kw: object) -> None:
            self.kw = kw

        def model_dump(self, mode: str) -> dict:
            return self.kw

    class Fo:
        params = {"page": 2}

    assert fingerprint([It(a=1), It(a=2), Fo()]) == fingerprint([Fo(), It(a=2), It(a=1)])
    assert fingerprint([It(a=1)]) != fingerprint([It(a=1, b=0)])


def test_agreeing_samples_decide_http_and_resampling_catches_a_change(
    store: AdaptiveStore,
) -> None:
    assert store.plan(EP, PAT).mode == SAMPLE  # learning: both ways
    assert store.record(EP, PAT, sample(True)) == LEARNING
    assert store.plan(EP, PAT).mode == SAMPLE
    assert store.record(EP, PAT, sample(True)) == HTTP  # two agreeing samples
    modes = [store.plan(EP, PAT).mode for _ in range(4)]
    assert modes == [HTTP, HTTP, HTTP, SAMPLE]  # every 4th page of a decided pattern: both ways
    assert store.plan(EP, PAT).sample_items == 3  # what the agreeing samples yielded
    assert store.record(EP, PAT, sample(False)) == RENDER  # the page type changed
    d = store.decisions()[0]
    assert (d.endpoint, d.pattern, d.decision, d.changes) == (EP, PAT, RENDER, 1)
    assert (d.pages, d.fetched, d.rendered, d.samples, d.same, d.differ) == (7, 4, 3, 3, 2, 1)
    assert d.evidence[0]["same"] is False and "differ: rendered 3 items" in d.evidence[0]["why"]


def test_a_rendered_pattern_goes_back_to_http_after_agreeing_samples_in_a_row(
    store: AdaptiveStore,
) -> None:
    store.plan(EP, PAT)
    assert store.record(EP, PAT, sample(False)) == RENDER  # one disagreement decides
    assert [store.plan(EP, PAT).mode for _ in range(4)] == [RENDER, RENDER, RENDER, SAMPLE]
    assert store.record(EP, PAT, sample(True)) == RENDER  # one agreeing sample is not enough
    assert [store.plan(EP, PAT).mode for _ in range(4)] == [RENDER, RENDER, RENDER, SAMPLE]
    assert store.record(EP, PAT, sample(True)) == HTTP
    d = store.decisions()[0]
    assert d.decision == HTTP and d.changes == 1 and d.rendered_share == 1.0
    store.forget(EP, PAT)
    assert store.plan(EP, PAT).decision == LEARNING
