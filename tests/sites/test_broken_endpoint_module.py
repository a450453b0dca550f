"""A task whose module failed to import is unknown; the error names that module, its file and
line and its exception, not a "did you mean" another endpoint of the site (what a chain that
uses it, `parse` and `trigger` print)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import chains
import sites
from exceptions import UnknownTaskError
from utils.modules import BrokenModule
from utils.registry import UnknownNameError

BAD = BrokenModule(
    "sites.demo.pc.nope", "sites/demo/pc/nope.py", 14,
    "UnknownNameError: unknown fetcher 'impersonat'; did you mean 'impersonate'?",
)  # fmt: skip


@pytest.fixture
def broken_endpoint() -> Iterator[None]:
    sites.load_all()
    sites._broken[BAD.module] = BAD
    try:
        yield
    finally:
        del sites._broken[BAD.module]


def test_the_unknown_task_names_its_broken_module(broken_endpoint: None) -> None:
    with pytest.raises(UnknownNameError) as err:
        sites.get_endpoint("demo.pc.nope")
    msg = str(err.value)
    assert msg.startswith("unknown task 'demo.pc.nope': its site module sites.demo.pc.nope ")
    assert "(sites/demo/pc/nope.py:14) failed to import: UnknownNameError: unknown fetcher" in msg
    assert "did you mean 'demo." not in msg


def test_a_chain_using_it_says_why(broken_endpoint: None) -> None:
    with pytest.raises(UnknownTaskError, match=r"sites/demo/pc/nope\.py:14\) failed to import"):
        chains.define("uses_nope", chains.step("demo.pc.nope"))


def test_a_broken_package_above_it_is_named(broken_endpoint: None) -> None:
    pkg = BrokenModule("sites.zz", "sites/zz/__init__.py", 1, "NameError: x")
    sites._broken[pkg.module] = pkg
    try:
        with pytest.raises(UnknownNameError, match=r"its site module sites\.zz \("):
            sites.get_endpoint("zz.pc.list")
    finally:
        del sites._broken[pkg.module]


def test_other_unknown_tasks_keep_the_did_you_mean(broken_endpoint: None) -> None:
    with pytest.raises(UnknownNameError, match=r"did you mean 'demo\.h5\.feed'"):
        sites.get_endpoint("demo.h5.fed")
