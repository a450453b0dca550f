"""`import_tree`: a module that raises at import is recorded with its file and line; the
rest of the tree is imported."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from utils.modules import import_tree


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    name = f"tree_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    (root / "sub").mkdir(parents=True)
    (root / "brokenpkg").mkdir()
    (root / "__init__.py").write_text("")
    (root / "ok.py").write_text("X = 1\n")
    (root / "syntax.py").write_text("def f(:\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "deep.py").write_text("import json\n\n\njson.loads('{')\n")
    (root / "sub" / "fine.py").write_text("Y = 2\n")
    (root / "brokenpkg" / "__init__.py").write_text("raise RuntimeError('no')\n")
    (root / "brokenpkg" / "never.py").write_text("Z = 3\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield name, root
    finally:
        sys.path.remove(str(tmp_path))
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]


def test_broken_modules_are_named_with_file_and_line(tree: tuple[str, Path]) -> None:
    name, root = tree
    names, broken = import_tree(name)
    assert sorted(names) == [f"{name}.ok", f"{name}.sub", f"{name}.sub.fine"]
    got = {b.module: (b.file, b.line, b.error.split(":")[0]) for b in broken}
    assert got == {
        f"{name}.syntax": (str(root / "syntax.py"), 1, "SyntaxError"),
        # the line of the tree's module, not the library's frame that raised
        f"{name}.sub.deep": (str(root / "sub" / "deep.py"), 4, "JSONDecodeError"),
        f"{name}.brokenpkg": (str(root / "brokenpkg" / "__init__.py"), 1, "RuntimeError"),
    }
    [deep] = [b for b in broken if b.module.endswith("deep")]
    assert deep.describe() == (
        f"module {name}.sub.deep ({root}/sub/deep.py:4) failed to import: JSONDecodeError: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    )
    assert f"{name}.sub.deep" not in sys.modules  # a later import tries again


def test_a_package_that_does_not_import_is_the_one_broken_module() -> None:
    names, [b] = import_tree("no_such_package_here")
    assert names == [] and b.module == "no_such_package_here"
    assert b.error.startswith("ModuleNotFoundError: ")
