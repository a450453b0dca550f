"""The project installs as a package (`pip install .` and `pip install -e .`) with a
`chaincrawl` command that is `python -m cli`, its Lua scripts and data files inside.

Built offline: a venv without pip of its own that sees the shared venv's site-packages (pip,
setuptools and every dependency) through a .pth file; `--no-deps --no-build-isolation
--no-index`, so nothing is downloaded. The checkout is copied first: a build leaves `build/`
behind, which must not land in the checkout the other tests run from."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from config import ROOT

pytestmark = pytest.mark.integration

SKIP = shutil.ignore_patterns(".venv*", "var", "tests", ".git", "build", "__pycache__", "*.pyc",
                              ".pytest_cache", ".ruff_cache", "*.egg-info")  # fmt: skip


# the user's environment, not this suite's (its CHAINCRAWL_EXTRA_SITE_PACKAGES names tests.*)
ENV = {k: v for k, v in os.environ.items() if not k.startswith("CHAINCRAWL_")}


def venv(where: Path) -> Path:
    """A venv whose imports fall back on this interpreter's site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    (pkgs,) = where.glob("lib/python3*/site-packages")
    (pkgs / "shared.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return pkgs


def pip_install(python: Path, *args: str, cwd: Path) -> None:
    out = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", *args], cwd=cwd,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src") / "chaincrawl"
    shutil.copytree(ROOT, src, ignore=SKIP)
    return src


@pytest.mark.usefixtures("checkout_files")  # copies the checkout (the module's fixture)
def test_pip_install_gives_the_chaincrawl_command_and_the_lua_scripts(
    checkout: Path, tmp_path: Path
) -> None:
    pkgs = venv(tmp_path / "venv")
    pip_install(tmp_path / "venv" / "bin" / "python", ".", cwd=checkout)
    command = tmp_path / "venv" / "bin" / "chaincrawl"
    out = subprocess.run([str(command), "--help"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    same = subprocess.run([sys.executable, "-m", "cli", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert out.stdout == same.stdout
    version = subprocess.run([str(command), "--version"], cwd=tmp_path, env=ENV, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert version.stdout.strip().startswith("chaincrawl ")
    for module in ("base_task.py", "config.py", "exceptions.py", "worker.py"):
        assert (pkgs / module).is_file(), module
    # the checkout's own scripts: not what var/ holds (the benchmark's exported revisions)
    shipped = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("[!t.]*/**/*.lua")
               if p.relative_to(ROOT).parts[0] not in ("var", "build")}  # fmt: skip
    assert shipped, "no Lua script in the checkout?"
    installed = {p.relative_to(pkgs).as_posix() for p in pkgs.glob("*/**/*.lua")}
    assert shipped <= installed, shipped - installed
    assert (pkgs / "monitor" / "grafana" / "chaincrawl.json").is_file()
    assert not (pkgs / "tests").exists()
    code = "import ledger.state, cli.parser; print(ledger.state.__file__)"
    where = subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-c", code], cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert where.stdout.strip().startswith(str(pkgs)), where.stdout + where.stderr


def test_pip_install_editable_runs_the_checkout(checkout: Path, tmp_path: Path) -> None:
    venv(tmp_path / "venv")
    pip_install(tmp_path / "venv" / "bin" / "python", "-e", ".", cwd=checkout)
    code = "import ledger.state, worker; print(ledger.state.__file__, worker.__file__)"
    where = subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-c", code], cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert where.stdout.split() == [str(checkout / "ledger" / "state.py"),
                                    str(checkout / "worker.py")], where.stderr  # fmt: skip
    out = subprocess.run([str(tmp_path / "venv" / "bin" / "chaincrawl"), "runs", "--lmit", "1"],
                         cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "did you mean --limit?" in out.stderr
