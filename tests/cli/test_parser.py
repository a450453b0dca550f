"""The command line through the real `control.sh`: help that does nothing else (no venv, no
stop), one help listing every command, "did you mean" under the right command's usage,
`--version`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli import parser
from config import DEFAULT_POOL, POOLS, ROOT
from external_interface.storage.columnar import FORMATS as COLUMNAR_FORMATS
from external_interface.storage.export import FORMATS


def control(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run([str(root / "control.sh"), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """control.sh and the CLI package without a venv: what a fresh checkout has."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copy2(ROOT / "control.sh", root / "control.sh")
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    shutil.copytree(ROOT / "cli", root / "cli", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_parser_needs_only_the_standard_library() -> None:
    code = ("import sys; sys.path.insert(0, '.'); import cli.parser; cli.parser.build_parser(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)"
            " - {'__main__'}))")  # fmt: skip
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=ROOT, capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['cli']"


def test_copies_match_their_sources() -> None:
    assert parser.POOLS == POOLS and parser.POOLS[0] == DEFAULT_POOL
    assert parser.ITEM_FORMATS == FORMATS + COLUMNAR_FORMATS


def test_help_lists_every_command_shell_handled_ones_too() -> None:
    out = control("--help")
    assert out.returncode == 0, out.stderr
    for cmd in ("setup", "lock", "test", "lint", "restart", "start", "stop", "trigger", "runs",
                "deadletter", "chains", "demo", "items", "new-site", "beat", "monitor"):  # fmt: skip
        assert f"\n    {cmd}" in out.stdout, cmd
    assert control("help").stdout == out.stdout
    assert control().stdout == out.stdout
    assert "usage: control.sh runs" in control("help", "runs").stdout


@pytest.mark.parametrize("cmd", ["restart", "start", "stop", "trigger", "deadletter", "setup",
                                 "test", "lint", "lock", "demo", "monitor", "redis"])  # fmt: skip
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_command_help_does_nothing_else_and_needs_no_venv(bare: Path, cmd: str, flag: str) -> None:
    out = control(cmd, flag, root=bare)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: control.sh {cmd}")
    assert out.stderr == ""
    assert not (bare / ".venv").exists() and not (bare / "var").exists()


def test_unknown_command_names_the_nearest_with_its_usage(bare: Path) -> None:
    out = control("strat", root=bare)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == "error: unknown command 'strat' (did you mean 'start'?)"
    assert "usage: control.sh start" in out.stderr
    out = control("xyzzy", root=bare)
    assert out.returncode == 2 and "unknown command 'xyzzy'" in out.stderr
    assert not (bare / ".venv").exists()


def test_did_you_mean_counts_swapped_letters_as_one_slip(bare: Path) -> None:
    """`prase` is `parse` with two letters swapped (one slip), `pause` two letters changed:
    difflib's ratio alone ranked `pause` first."""
    out = control("prase", "demo.pc.feed", root=bare)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == "error: unknown command 'prase' (did you mean 'parse'?)"
    assert parser.nearest("stauts", ["start", "status", "stop"]) == "status"
    assert parser.nearest("trigegr", ["trigger", "runs"]) == "trigger"
    assert parser.nearest("xyzzy", ["start", "status"]) is None


def test_every_command_s_help_lists_its_exit_statuses(bare: Path) -> None:
    """Status 5 (Redis unreachable) is listed wherever a command talks to Redis."""
    for cmd, sub in parser._commands(parser.build_parser()).items():
        out = control(cmd, "--help", root=bare) if cmd in ("trigger", "status", "parse") else None
        text = out.stdout if out is not None else sub.format_help()
        assert "exit status:" in text, cmd
        assert "\n  0  " in text and "\n  2  usage error" in text, cmd
        assert ("\n  5  Redis or the broker unreachable" in text) == (
            cmd not in parser._NO_REDIS
        ), cmd


def test_unknown_flag_names_the_nearest_under_its_commands_usage(bare: Path) -> None:
    out = control("runs", "--lmit", "3", root=bare)
    assert out.returncode == 2
    assert (
        out.stderr.splitlines()[-1] == "error: unrecognized argument --lmit (did you mean --limit?)"
    )
    assert out.stderr.startswith("usage: control.sh runs")
    out = control("restart", "--concurency", "4", root=bare)  # refused before anything stops
    assert out.returncode == 2 and "did you mean --concurrency?" in out.stderr
    out = control("deadletter", "lst", root=bare)
    assert out.returncode == 2 and "(did you mean 'list'?)" in out.stderr
    out = control("--verison", root=bare)
    assert out.returncode == 2 and "did you mean --version?" in out.stderr
    assert not (bare / ".venv").exists()


def test_version_comes_from_pyproject(bare: Path) -> None:
    out = control("--version", root=bare)
    assert out.returncode == 0
    assert out.stdout.strip() == f"chaincrawl {parser.version()}"
    assert parser.version().count(".") == 2


def test_python_help_imports_neither_redis_nor_kombu_nor_the_settings() -> None:
    """`python -m cli --help` (the `chaincrawl` command) answers from cli.parser alone: the
    command's modules (redis-py, kombu, pydantic and the settings) are imported when it runs."""
    code = ("import sys\nfrom cli.__main__ import main\ntry:\n    main(['runs', '--help'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('redis', 'kombu', 'celery', 'pydantic', 'config', 'rich')"
            " if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_python_entry_point_uses_the_same_parser() -> None:
    out = subprocess.run([sys.executable, "-m", "cli", "runs", "--lmit", "3"], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and "did you mean --limit?" in out.stderr
    out = subprocess.run([sys.executable, "-m", "cli", "lint"], cwd=ROOT, capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode == 2 and "./control.sh lint" in out.stderr


def test_every_command_has_a_handler_or_is_control_sh_s_own() -> None:
    from cli.__main__ import handler

    for name, sub in parser._commands(parser.build_parser()).items():
        fn = sub.get_default("fn")
        if name in (*parser.SHELL_COMMANDS, "help"):
            assert fn is None, name
        else:
            assert callable(handler(fn)), name
