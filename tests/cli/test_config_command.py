"""`./control.sh config`: the CHAINCRAWL_* variables set, and the ones nothing reads."""

from __future__ import annotations

import os
import subprocess
import sys

from config import ROOT


def run(tmp_path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINCRAWL_")}
    env.update(CHAINCRAWL_VAR_DIR=str(tmp_path / "var"), **extra)
    return subprocess.run([sys.executable, "-m", "cli", "config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_config_passes_names_that_are_read(tmp_path) -> None:
    out = run(tmp_path, CHAINCRAWL_SIGN_KEY_DEMO="k-123", CHAINCRAWL_POOL_COOKIE_DEMO="{}")
    assert out.returncode == 0, out.stderr
    assert "each is read by chaincrawl" in out.stdout
    assert "k-123" not in out.stdout + out.stderr


def test_config_names_a_typo_and_fails(tmp_path) -> None:
    out = run(tmp_path, CHAINCRAWL_MAX_RETRYS="3", CHAINCRAWL_ACCOUNTS_DEMOO="u:pw-secret")
    assert out.returncode == 2
    assert (
        "CHAINCRAWL_MAX_RETRYS is not a chaincrawl setting; did you mean CHAINCRAWL_MAX_RETRIES?"
        in out.stdout
    )
    assert (
        "CHAINCRAWL_ACCOUNTS_DEMOO: no site 'demoo'; did you mean CHAINCRAWL_ACCOUNTS_DEMO?"
        in out.stdout
    )
    assert "error: 2 variable(s) that nothing reads" in out.stderr
    assert "pw-secret" not in out.stdout + out.stderr


def test_config_lists_the_names_of_dotenv_and_checks_their_values(tmp_path) -> None:
    """A `.env` line is read by every process: `config` names it (marked), not "0 set", and
    a value the workers cannot use (a limits entry that is no rate, a sink that does not
    exist) fails it as `start` or the workers would, naming the variable."""
    (tmp_path / ".env").write_text("CHAINCRAWL_SINKS=jsnol\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINCRAWL_")}
    env.update(CHAINCRAWL_VAR_DIR=str(tmp_path / "var"), CHAINCRAWL_LIMITS="jobs=5/x",
               PYTHONPATH=str(ROOT))  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "cli", "config"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "CHAINCRAWL_LIMITS, CHAINCRAWL_SINKS (.env), CHAINCRAWL_VAR_DIR" in out.stdout
    assert "CHAINCRAWL_LIMITS: entry 'jobs=5/x': '5/x' is not a rate like 20/s" in out.stdout
    assert "CHAINCRAWL_SINKS: unknown sink 'jsnol'; did you mean 'jsonl'?" in out.stdout
    assert "error: 2 value(s) the workers cannot use" in out.stderr
