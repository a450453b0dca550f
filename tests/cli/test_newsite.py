"""The generator's files pass lint, import as a real endpoint, and their test runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid

import pytest

from cli import UserError
from cli.newsite import generate
from config import ROOT


def test_generated_endpoint_lints_loads_and_its_test_skips_then_passes() -> None:
    site = f"zzgen{uuid.uuid4().hex[:6]}"
    created = generate(site, "pc", "user_info")
    try:
        rel = [str(p.relative_to(ROOT)) for p in created]
        ruff = (
            [str(ROOT / ".venv/bin/ruff")]
            if (ROOT / ".venv/bin/ruff").exists()
            else [sys.executable, "-m", "ruff"]
        )
        assert subprocess.run([*ruff, "check", *rel], cwd=ROOT).returncode == 0
        assert subprocess.run([*ruff, "format", "--check", *rel], cwd=ROOT).returncode == 0
        test_file = ROOT / "tests/sites" / site / "pc" / "test_user_info.py"
        run = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            str(test_file),
        ]
        out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "1 skipped" in out.stdout and "no fixture yet" in out.stdout
        fixture = test_file.parent / "fixtures" / "user_info.html"
        fixture.write_text('<div class="item" data-id="7"><a>Seven</a></div><a class="next">2</a>')
        out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
        with pytest.raises(UserError, match="exists already"):
            generate(site, "pc", "user_info")
    finally:
        shutil.rmtree(ROOT / "sites" / site, ignore_errors=True)
        shutil.rmtree(ROOT / "tests/sites" / site, ignore_errors=True)


@pytest.mark.parametrize("bad", ["Demo", "1site", "class", "a-b", ""])
def test_bad_names_are_refused(bad: str) -> None:
    with pytest.raises(UserError, match="lower-case Python name"):
        generate(bad, "pc", "x")
