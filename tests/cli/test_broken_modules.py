"""A site or chain module that fails at import is named in one line (file, line, exception)
by every command and by the workers, and everything else goes on: the real `control.sh`
(start, status, trigger, restart, stop) with a real worker, and the `module_broken` alert."""

from __future__ import annotations

import os
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker.workers import TaskSets
from config import Settings
from monitor.alerts import Evaluator, parse_config
from tests.cli.conftest import control as cli_control
from tests.conditions import wait_for

pytestmark = pytest.mark.integration


def control(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return cli_control(*args, env=env, timeout=240)


@pytest.fixture
def broken_env(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A site package with one good endpoint module and one that raises at import, and a
    chain package with one good chain module and one whose definition is wrong."""
    pkg = f"brokensite_{uuid.uuid4().hex[:6]}"
    root = tmp_path / "pkgs" / pkg
    (root / "pc").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "pc" / "__init__.py").write_text("")
    (root / "pc" / "bad.py").write_text('"""A typo at import."""\n\nvalue = undefined_name + 1\n')
    chains_pkg = f"brokenchains_{uuid.uuid4().hex[:6]}"
    croot = tmp_path / "pkgs" / chains_pkg
    croot.mkdir()
    (croot / "__init__.py").write_text("")
    (croot / "good.py").write_text(
        textwrap.dedent("""\
        from chains import define, step

        define("ok_social", step("demo.h5.feed"))
    """)
    )
    (croot / "wrong.py").write_text(
        textwrap.dedent("""\
        from chains import define, step

        define("wrong_chain", step("demo.h5.no_such_task"))
    """)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINCRAWL_")}
    env.update({"CHAINCRAWL_REDIS_URL": redis_url, "CHAINCRAWL_KEY_PREFIX": key_prefix,
                "CHAINCRAWL_VAR_DIR": str(tmp_path / "var"),
                "CHAINCRAWL_EXTRA_SITE_PACKAGES": pkg,
                "CHAINCRAWL_EXTRA_CHAIN_PACKAGES": chains_pkg,
                "PYTHONPATH": str(tmp_path / "pkgs"), "COLUMNS": "200",
                "pkg": pkg, "chains_pkg": chains_pkg})  # fmt: skip
    try:
        yield env
    finally:
        control("stop", "--timeout", "20", "--keep-redis", env=env)


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("warning:")]


def test_a_broken_site_module_is_one_line_and_the_rest_runs(
    broken_env: dict[str, str], rds: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    env, pkg = broken_env, broken_env["pkg"]
    where = f"module {pkg}.pc.bad ({env['PYTHONPATH']}/{pkg}/pc/bad.py:3) failed to import: "
    error = "NameError: name 'undefined_name' is not defined"

    out = control("status", "--inspect-timeout", "0.5", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    site_warning = [w for w in _warnings(out.stderr) if "site module" in w]
    assert site_warning == [f"warning: site {where}{error}; every other site works"]
    assert f"site module {pkg}.pc.bad" in out.stdout and "bad.py:3" in out.stdout

    out = control("start", "--workers", "1", "-c", "2", "--pool", "threads", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    log = Path(env["CHAINCRAWL_VAR_DIR"]) / "log" / "worker-w1.log"
    assert f"{where}{error}" in log.read_text()
    assert "Traceback" not in log.read_text()

    s = Settings(redis_url=redis_url, key_prefix=key_prefix)
    [w] = wait_for(
        lambda: list(TaskSets(rds, s).live().values()), timeout=60, what="the worker's task set"
    )
    assert [b["module"] for b in w.broken] == [f"{pkg}.pc.bad"]

    # the alert fires at the first evaluation, naming the file and line
    rule = {"name": "module_broken", "kind": "module_broken", "above": 0, "for": 0}
    ev = Evaluator(rds, parse_config({"rules": [rule]}), s)
    [t] = ev.tick(force=True) or []
    assert (t.rule, t.subject, t.action) == ("module_broken", f"{pkg}.pc.bad", "fire")
    assert f"{pkg}/pc/bad.py:3: {error}" in t.summary

    out = control("trigger", "demo_social", "--no-wait", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "run id:" in out.stdout

    out = control("restart", "--workers", "1", "-c", "2", "--pool", "threads", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "workers ready: worker-w1" in out.stdout
    assert "Traceback" not in out.stderr


def test_a_broken_chain_module_is_named_and_other_chains_trigger(
    broken_env: dict[str, str],
) -> None:
    env, cpkg = broken_env, broken_env["chains_pkg"]
    out = control("trigger", "ok_social", "--no-wait", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    [line] = [w for w in _warnings(out.stderr) if "chain module" in w]
    assert line.startswith(f"warning: chain module {cpkg}.wrong ({env['PYTHONPATH']}/{cpkg}/"
                           "wrong.py:3) failed to import: UnknownTaskError: ")  # fmt: skip
    assert "demo.h5.no_such_task" in line
    assert "Traceback" not in out.stderr

    out = control("trigger", "wrong_chain", "--no-wait", env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    [err] = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert "wrong_chain" in err and f"{cpkg}/wrong.py:3" in err
    assert "Traceback" not in out.stderr
