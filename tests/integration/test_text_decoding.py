"""Undecodable text end to end: a real worker reads a Latin-1 page labelled UTF-8. By default
the page is stored with U+FFFD and counted (its run's step, the endpoint's metrics) and the
run shows a warning; an endpoint declared `decode_errors="strict"` fails the page instead,
at once, with a dead letter that says why."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

import chains
from chains import Chain, step
from config import ROOT
from external_interface.storage.sinks.jsonl import read_items
from monitor.deadletter import DeadLetterStore
from monitor.status import summary, task_metrics
from utils.redis import get_redis

pytestmark = pytest.mark.integration


def test_undecodable_text_is_stored_counted_and_shown(start_worker, cc_env) -> None:
    start_worker()
    run = chains.run(Chain("undecodable", step("testsite.local.text")), seeds=[
        {"path": "/mislabelled"}])  # fmt: skip
    p = run.wait(timeout=60)
    assert p.complete and p.steps["local.text"]["succeeded"] == 1
    assert p.steps["local.text"]["undecodable"] == p.totals["undecodable"] == 1
    titles = [i["title"] for i in read_items("testsite.text") if i["path"] == "/mislabelled"]
    assert titles == ["caf\ufffd cr\ufffdme"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the metrics are written within a flush interval
        m = summary(task_metrics(get_redis()).get("testsite.local.text", {}))
        if m["undecodable"]:
            break
        time.sleep(0.1)
    assert (m["undecodable"], m["undecodable_bytes"]) == (1, 2)
    out = subprocess.run([str(ROOT / "control.sh"), "runs", run.run_id], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "warning: text with undecodable bytes" in out.stdout and "local.text" in out.stdout


def test_a_strict_endpoint_fails_the_page_without_retrying(start_worker, cc_env) -> None:
    start_worker()
    run = chains.run(Chain("strict", step("testsite.local.text_strict")), seeds=[
        {"path": "/mislabelled"}])  # fmt: skip
    p = run.wait(timeout=60)
    s = p.steps["local.text_strict"]
    assert (s["failed"], s["retried"], s["succeeded"]) == (1, 0, 0)
    (dl,) = DeadLetterStore(get_redis()).list(10, run=run.run_id)
    assert dl.error_type == "UndecodableText" and "2 bytes are not valid utf-8" in dl.error
