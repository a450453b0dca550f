"""`./control.sh test`'s width (control.sh `test_width`): 3 wide for the quick run, one at a
time for a run of sites' parser tests alone (offline replays, where starting three pytest
workers cost ten seconds) and for the runs that choose their own."""

from __future__ import annotations

import subprocess

import pytest

from config import ROOT


def width(*args: str) -> str:
    script = (
        "eval \"$(sed -n '/^test_width()/,/^}/p' control.sh)\"\n"  # the function alone
        'test_width "$@"'
    )
    out = subprocess.run(
        ["bash", "-c", script, "test_width", *args],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return out.stdout.strip()


@pytest.mark.parametrize(
    "args",
    [
        ("tests/sites/shop/pc/test_products.py",),
        ("./tests/sites/shop",),
        ("-q", "tests/sites/shop/pc/test_products.py", "tests/sites/quotes"),
        ("-m", "extended"),
        ("tests/cli/test_shell.py::test_a_failed_fetch_is_named_too",),
        ("-n", "4", "tests/cli"),
    ],
)
def test_one_at_a_time(args: tuple[str, ...]) -> None:
    assert width(*args) == ""


@pytest.mark.parametrize(
    "args", [(), ("-q",), ("tests/cli",), ("tests/sites/shop", "tests/cli/test_shell.py")]
)
def test_three_wide(args: tuple[str, ...]) -> None:
    assert width(*args) == "-n 3"
