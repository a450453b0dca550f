"""`control.sh trigger`: its exit status says how the run ended (0 every task succeeded,
1 failed tasks, 2 usage, 3 cancelled, 4 still running), and seeds come from a file or stdin
when there are too many for the command line."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from config import ROOT
from tests.cli.conftest import control
from tests.testsite.server import TestSite

pytestmark = pytest.mark.integration


def run_id(stdout: str) -> str:
    m = re.search(r"run id: (\S+)", stdout)
    assert m, stdout
    return m.group(1)


def run_json(rid: str, env: dict[str, str]) -> dict[str, Any]:
    out = control("runs", rid, "--json", env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_task_succeeded_exits_0(crawl: dict[str, str]) -> None:
    out = control("trigger", "cli_probe", '[{"path": "/detail/a"}, {"path": "/detail/b"}]',
                  "--timeout", "120", env=crawl)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every task succeeded" in out.stdout
    p = run_json(run_id(out.stdout), crawl)
    assert (p["ok"], p["ending"], p["failed"]) == (True, "ok", 0)


def test_failed_tasks_exit_1_with_their_count_and_the_command_to_see_them(
    crawl: dict[str, str],
) -> None:
    seeds = "\n".join(json.dumps({"path": p}) for p in
                      ("/status/404?a", "/status/404?b", "/status/410", "/detail/c"))  # fmt: skip
    out = control("trigger", "cli_probe", "--seeds-file", "-", "--timeout", "120",
                  env=crawl, stdin=seeds)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    rid = run_id(out.stdout)
    assert out.stderr.strip() == (
        f"run {rid} ended with 3 failed task(s): ./control.sh deadletter list --run {rid}"
    )
    p = run_json(rid, crawl)
    assert p["status"] == "done" and p["complete"]  # the ledger's rule: every task finished
    assert (p["ok"], p["ending"], p["failed"]) == (False, "failed", 3)
    # at 80 columns, in a pipe: the run id and the task name whole, the failures said
    shown = control("runs", rid, env=crawl).stdout
    assert rid in shown and "testsite.local.probe" in shown
    assert "done with 3 failed task(s)" in shown
    assert rid in control("runs", env=crawl).stdout


def test_a_page_that_yields_nothing_is_warned_in_the_summary(crawl: dict[str, str]) -> None:
    """The run succeeds (exit 0) but says a page matched nothing, by step."""
    seed = json.dumps({"url": crawl["TESTSITE_URL"] + "/gbk"})  # an HTML page, no `li.row`
    out = control("trigger", "cli_rows", seed, "--timeout", "120", env=crawl)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "complete: every task succeeded" in out.stdout
    assert ("warning: 1 page(s) yielded nothing (no item, no follow-up): local.rows 1; a "
            "selector that matches nothing?") in out.stderr  # fmt: skip


def test_still_running_at_the_timeout_exits_4(crawl: dict[str, str]) -> None:
    out = control("trigger", "cli_probe", '{"path": "/slow?s=4"}', "--timeout", "0.5", env=crawl)
    assert out.returncode == 4, out.stdout + out.stderr
    assert "still running after 0.5s" in out.stderr


def test_a_cancelled_run_exits_3(crawl: dict[str, str], cli_site: TestSite) -> None:
    # the page is held until the run is cancelled: however loaded the machine, the run cannot
    # end on its own first
    key = uuid.uuid4().hex
    cmd = [str(ROOT / "control.sh"), "trigger", "cli_probe", json.dumps({"path": f"/hold/{key}"}),
           "--timeout", "240"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=crawl, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # "run id: ...", printed as soon as the run is made
        rid = run_id(first)
        assert control("cancel", rid, env=crawl).returncode == 0
        cli_site.release(key)
        _, err = proc.communicate(timeout=240)
    finally:
        cli_site.release(key)
        proc.kill()
    assert proc.returncode == 3, err
    assert f"run {rid} was cancelled" in err


def test_usage_errors_exit_2(crawl_env: dict[str, str], tmp_path: Path) -> None:
    out = control("trigger", "no_such_chain", env=crawl_env)
    assert out.returncode == 2 and out.stderr.startswith("error:"), out.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"path": "/a"}\n{"path": \n')
    out = control("trigger", "cli_probe", "--seeds-file", str(bad), env=crawl_env)
    assert out.returncode == 2
    assert out.stderr.startswith(f"error: {bad} line 2: not JSON"), out.stderr
    out = control("trigger", "cli_probe", "{}", "--seeds-file", str(bad), env=crawl_env)
    assert out.returncode == 2 and "not both" in out.stderr


def test_a_seed_of_the_wrong_type_or_a_misspelled_field_exits_2_in_one_line(
    crawl_env: dict[str, str],
) -> None:
    """Seeds are as strict as constants: `true` or `"2"` is no page number (not page 1 or 2),
    and an unknown field is named with the nearest real one."""
    for seed, says in [
        ('{"page": true}', "field 'page': Input should be a valid integer (got true)"),
        ('{"page": "2"}', "field 'page': Input should be a valid integer (got \"2\")"),
        ('{"pgae": 2}', "field 'pgae': unknown field; did you mean 'page'?"),
    ]:
        out = control("trigger", "cli_listing", seed, "--no-wait", env=crawl_env)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr == f"error: seed 0: testsite.local.listing: {says}\n", out.stderr
        assert "run id" not in out.stdout


@pytest.mark.parametrize("how", ["file-jsonl", "stdin-list"])
def test_ten_thousand_seeds_from_a_file_or_stdin(crawl_env: dict[str, str], tmp_path: Path,
                                                 how: str) -> None:  # fmt: skip
    env = {**crawl_env, "CHAINCRAWL_KEY_PREFIX": f"many{uuid.uuid4().hex[:6]}"}  # no worker here
    seeds = [{"path": f"/detail/e{i}"} for i in range(10_000)]
    if how == "file-jsonl":
        f = tmp_path / "seeds.jsonl"
        f.write_text("".join(json.dumps(s) + "\n" for s in seeds))
        out = control("trigger", "cli_probe", "--seeds-file", str(f), "--no-wait", env=env)
    else:
        out = control("trigger", "cli_probe", "--seeds-file", "-", "--no-wait", env=env,
                      stdin=json.dumps(seeds))  # fmt: skip
    assert out.returncode == 0, out.stderr
    p = run_json(run_id(out.stdout), env)
    assert p["totals"]["dispatched"] == 10_000


def test_chains_lists_each_step_s_full_task_name(crawl_env: dict[str, str]) -> None:
    out = control("chains", env=crawl_env)  # COLUMNS=80, a pipe
    assert out.returncode == 0, out.stderr
    assert "cli_probe: local.probe=testsite.local.probe" in out.stdout.splitlines()


@pytest.mark.parametrize(
    ("text", "got"),
    [
        ('"page=1"', "got a JSON string"),
        ("3", "got a JSON number"),
        ('[{"page": 1}, 2]', "got a list whose item 1 is a JSON number"),
        ("[[1]]", "got a list whose item 0 is a JSON list"),
    ],
)
def test_seeds_that_are_no_objects_say_what_they_are(text: str, got: str) -> None:
    """`trigger jobs '"page=1"'` was refused without saying the shell had left a string."""
    from cli import UserError
    from cli.__main__ import _seeds

    with pytest.raises(UserError) as ei:
        _seeds(text)
    assert str(ei.value).startswith("seeds must be a JSON object or a list of objects")
    assert str(ei.value).endswith(got)
