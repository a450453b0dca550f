"""The list of the extended run (tests/extended.txt): what an entry names, and that every
entry's file exists (a moved module must not slip back into the quick run)."""

from __future__ import annotations

from config import ROOT
from tests.conftest import EXTENDED, extended_entries, matches


def test_an_entry_names_a_test_its_parameters_its_module_or_its_folder() -> None:
    test = "tests/integration/test_a.py::test_b[redis]"
    for entry in ("tests/integration/test_a.py::test_b[redis]", "tests/integration/test_a.py::test_b",
                  "tests/integration/test_a.py", "tests/integration", "tests/integration/"):  # fmt: skip
        assert matches(test, entry), entry
    for entry in ("tests/integration/test_a.py::test_bc", "tests/integration/test_a.py::test_b[cluster]",
                  "tests/integration/test_ab.py", "tests/integ"):  # fmt: skip
        assert not matches(test, entry), entry


def test_comments_and_blank_lines_are_no_entries() -> None:
    text = "# heading\n\ntests/a.py::t  # why\n   \ntests/b.py\n"
    assert extended_entries(text) == ["tests/a.py::t", "tests/b.py"]


def test_every_entry_names_an_existing_file() -> None:
    entries = extended_entries(EXTENDED.read_text())
    missing = [e for e in entries if not (ROOT / e.split("::")[0]).exists()]
    assert missing == []
