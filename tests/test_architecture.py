"""tests/architecture.py: the import graph holds the top-level modules (import-linter takes
packages only), with the imports they make and the imports made of them, and the acyclic
contract finds a cycle through one of them. And the size rule: no library module (all but
tests/) over 600 lines, base_task.py at most 500."""

from __future__ import annotations

import os
from pathlib import Path

import grimp
import pytest

from tests.architecture import ROOT, _strongly_connected, build_graph, top_level_modules

pytestmark = pytest.mark.usefixtures("checkout_files")  # reads every file of the checkout

MAX_LINES = 600  # a library module holds one job: past this, split it by concern
MAX_LINES_OF = {"base_task.py": 500}  # the task base class stays readable in one sitting
NOT_LIBRARY = {"tests", "var", "build"}  # top-level folders: the tests, run data, builds


def library_modules(root: Path) -> list[Path]:
    """Every `*.py` of the project but the tests, run data and hidden folders (venvs, caches)."""
    found = []
    for folder, dirs, files in os.walk(root):
        top = Path(folder) == root
        hidden = [d for d in dirs if d.startswith(".") or d == "__pycache__"]
        dirs[:] = [d for d in dirs if d not in hidden and not (top and d in NOT_LIBRARY)]
        found += [Path(folder, f) for f in files if f.endswith(".py")]
    return sorted(found)


def oversized(root: Path) -> list[str]:
    """`path: N lines (at most M)` for each library module over its limit."""
    out = []
    for path in library_modules(root):
        rel = path.relative_to(root).as_posix()
        limit = MAX_LINES_OF.get(rel, MAX_LINES)
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out.append(f"{rel}: {n} lines (at most {limit})")
    return out


def test_no_library_module_is_over_its_line_limit() -> None:
    assert len(library_modules(ROOT)) > 100  # the walk found the project
    assert oversized(ROOT) == []


def test_the_line_limit_counts_the_library_and_base_task_only(tmp_path: Path) -> None:
    def write(rel: str, lines: int) -> None:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n" * lines)

    write("pkg/ok.py", 600)
    write("pkg/sub/big.py", 601)
    write("base_task.py", 501)
    write("bench/bench.py", 700)
    write("tests/test_long.py", 900)
    write(".venv/lib/site.py", 900)
    write("var/run.py", 900)
    write("pkg/tests/long.py", 601)  # a library folder named tests is library
    assert oversized(tmp_path) == [
        "base_task.py: 501 lines (at most 500)",
        "bench/bench.py: 700 lines (at most 600)",
        "pkg/sub/big.py: 601 lines (at most 600)",
        "pkg/tests/long.py: 601 lines (at most 600)",
    ]


def test_the_top_level_modules_are_the_single_files_beside_pyproject() -> None:
    assert {"base_task", "config", "exceptions", "worker"} <= set(top_level_modules())
    assert all((ROOT / f"{m}.py").is_file() for m in top_level_modules())


def test_the_graph_has_the_imports_of_and_into_a_top_level_module() -> None:
    g = build_graph("lifecycle", "sites", "external_interface", "utils", "base_task", "config")
    assert {"base_task", "config"} <= g.modules
    made = g.find_modules_directly_imported_by("base_task")
    assert {"lifecycle.context", "lifecycle.endpoints", "config"} <= made
    assert "sites.demo.h5.feed" in g.find_modules_that_directly_import("base_task")
    # `from lifecycle import runtime` is an import of the module lifecycle.runtime
    assert "lifecycle.runtime" in made
    assert not any(g.is_module_squashed(m) for m in g.modules)  # no third-party packages


def test_a_cycle_through_a_top_level_module_is_found(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "pkg_a"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("import top_mod\n")
    (tmp_path / "top_mod.py").write_text("from pkg_a import low\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("tests.architecture.ROOT", tmp_path)
    g: grimp.ImportGraph = build_graph("pkg_a", "top_mod")
    assert g.find_modules_directly_imported_by("top_mod") == {"pkg_a.low"}
    cycles = [sorted(c) for c in _strongly_connected(g, set(g.modules)) if len(c) > 1]
    assert cycles == [["pkg_a.low", "top_mod"]]
