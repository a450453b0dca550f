"""tests/architecture.py: the import graph holds the top-level modules (import-linter takes
packages only), with the imports they make and the imports made of them, and the acyclic
contract finds a cycle through one of them."""

from __future__ import annotations

from pathlib import Path

import grimp

from tests.architecture import ROOT, _strongly_connected, build_graph, top_level_modules


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
