"""A sink whose writes fail (here the type's folder is taken by a file: the same OSError path
as a full disk) fires the `sink_failing` alert at the first evaluation after the first failed
write, with the sink's error, and resolves once a write succeeds: a real worker and drainer."""

from __future__ import annotations

from pathlib import Path

import pytest

import chains
from chains import Chain, step
from config import get_settings
from monitor.alerts import Evaluator, parse_config
from tests.conditions import wait_for
from utils.redis import get_redis

pytestmark = pytest.mark.integration


def test_a_failing_sink_fires_at_the_first_failed_write_and_resolves(
    start_worker, cc_env, tmp_path: Path
) -> None:
    items = tmp_path / "items"
    items.mkdir()
    blocker = items / "testsite.probe"
    blocker.write_text("not a folder")  # every write of the type fails with an OSError
    start_worker(CHAINCRAWL_JSONL_DIR=str(items))
    r, s = get_redis(), get_settings()
    rule = {"name": "sink_failing", "kind": "sink_failing", "above": 0, "for": 0}
    ev = Evaluator(r, parse_config({"rules": [rule]}), s)
    run = chains.run(Chain("sinkfail", step("testsite.local.probe")),
                     seeds=[{"path": "/detail/sinkfail"}])  # fmt: skip
    fired = wait_for(lambda: [t for t in ev.tick(force=True) or [] if t.action == "fire"],
                     timeout=60, what="the sink_failing alert")  # fmt: skip
    [t] = fired
    assert t.subject == "jsonl" and "jsonl testsite.probe:" in t.summary, t.summary
    blocker.unlink()  # space again: the drainer's next try stores the item
    assert run.wait(timeout=60).complete
    resolved = wait_for(lambda: [t for t in ev.tick(force=True) or [] if t.action == "resolve"],
                        timeout=60, what="the alert's recovery")  # fmt: skip
    assert [t.subject for t in resolved] == ["jsonl"]
