"""bench/page_path.py: the recorder, and docs/architecture.md's table against a real crawl."""

from __future__ import annotations

import re
import sys
import threading

import pytest

from bench.page_path import (
    ROOT,
    Recorder,
    bottom_layer,
    lua_files,
    read_path,
    root_page,
    script_files,
)
from utils import process

DOC = ROOT / "docs" / "architecture.md"
STAGES = ("trigger", "page", "consumer", "store")


def test_the_recorder_names_each_checkout_file_once_with_its_functions() -> None:
    rec = Recorder()
    rec.install()
    try:
        process.new_id()
        process.new_id()
        len("not a checkout function")
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    (g,) = [g for g in rec.take().values() if "utils/process.py" in g["files"]]
    assert g["files"].count("utils/process.py") == 1
    assert "new_id" in g["funcs"]["utils/process.py"]
    assert not any(f.startswith(".venv") for f in g["files"])
    assert rec.take() == {}  # a take starts the next window empty


def test_a_module_whose_only_code_run_is_its_import_is_not_counted() -> None:
    """A module imported inside a window read runs its `<module>` code only: not a file the
    page passes through (what it calls is counted, in its own file)."""
    rec = Recorder()
    imported = compile("x = 1\n", str(ROOT / "utils" / "imported_only.py"), "exec")
    called = compile("process.new_id()\n", str(ROOT / "utils" / "calls_in.py"), "exec")
    rec.install()
    try:
        exec(imported, {})
        exec(called, {"process": process})
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    files = [f for g in rec.take().values() for f in g["files"]]
    assert "utils/imported_only.py" not in files
    assert "utils/calls_in.py" not in files
    assert "utils/process.py" in files


def test_an_evals_body_sent_without_its_comments_is_named_by_its_file() -> None:
    """EVAL sends the script's body each call (the metrics flush leaves its comments out);
    the body still names the `.lua` file it came from, not an inline script."""
    files = lua_files()
    text = files["monitor/metrics_add.lua"]
    body = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    assert body != text
    assert script_files(body, files)[0] == "monitor/metrics_add.lua"
    assert script_files("return 1", files) == ["(inline script)"]


def test_the_recorder_names_the_task_a_greenlet_ran_and_how_it_ended() -> None:
    rec = Recorder()
    rec.install()
    try:
        rec.task_started("t1", {"run": "r1", "step": "cat"})
        process.new_id()
        rec.task_ended("t1", "SUCCESS", "committed")
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    (g,) = [g for g in rec.take().values() if "utils/process.py" in g["files"]]
    assert g["tasks"] == [
        {"id": "t1", "run": "r1", "step": "cat", "state": "SUCCESS", "outcome": "committed"}
    ]


def _page(first: int, tid: str, state: str, step: str = "cat") -> dict[str, object]:
    task = {"id": tid, "run": "r1", "step": step, "state": state}
    return {"first": first, "files": [f"{tid}-{first}.py"], "tasks": [task]}


def test_the_page_read_is_the_root_tasks_last_attempt_whatever_ran_first() -> None:
    """On a busy machine the root page may wait and run again after a product page ran: the
    root task's last attempt is read, not the first page that raised nothing."""
    pages = [
        _page(1, "root", "RETRY"),
        _page(2, "p1", "SUCCESS", "product"),
        _page(3, "root", "SUCCESS"),
        _page(4, "p2", "SUCCESS", "product"),
    ]
    page, attempts = root_page(pages, "r1", "cat")
    assert page["files"] == ["root-3.py"] and attempts == 2
    with pytest.raises(RuntimeError, match="did not succeed"):
        root_page(pages[:2], "r1", "cat")
    with pytest.raises(RuntimeError, match="one root task"):
        root_page(pages, "r2", "cat")


def test_the_bottom_layer_is_config_settings_exceptions_and_utils() -> None:
    assert all(
        bottom_layer(f) for f in ("config.py", "exceptions.py", "settings/base.py", "utils/wire.py")
    )
    assert not any(bottom_layer(f) for f in ("base_task.py", "ledger/commits.py", "worker.py"))


def _section() -> str:
    text = DOC.read_text()
    start = text.index("### The modules a page passes through")
    return text[start : text.index("\n## ", start)]


def test_the_table_names_every_module_a_page_passes_through() -> None:
    """Every file the crawl's call path runs is named in the table (by its path, or by its
    name after its folder's first file), and the count sentence says the root page's totals,
    exactly (the page read is the root page's last attempt, whatever the machine's load)."""
    res = read_path()
    section = _section()
    named = set(re.findall(r"`([\w/.]+\.(?:py|lua))`", section))
    names = {n.rsplit("/", 1)[-1] for n in named}
    files: set[str] = set()
    scripts: set[str] = set()
    for stage in STAGES:
        files.update(res[stage]["files"])
        scripts.update(res[stage].get("scripts", []))
    library = {f for f in files if not f.startswith("bench/")}  # bench/: the endpoint's module
    missing = sorted(
        f for f in library | scripts if f not in named and f.rsplit("/", 1)[-1] not in names
    )
    where = {
        f: [(st, res[st].get("funcs", {}).get(f)) for st in STAGES if f in res[st].get("files", ())]
        for f in missing
    }  # fmt: skip
    assert not missing, f"the call path runs these, the table does not name them: {where}"
    above = [f for f in library if not bottom_layer(f)]
    text = " ".join(section.split())
    # one page's counts, the root page's (its last attempt: bench/page_path.py's root_page)
    counts = re.findall(r"(\d+) library files above the bottom layer and (\d+) in it", text)
    lua = re.findall(r"(\d+) Lua files", text)
    assert len(counts) == 1 and len(lua) == 1, f"the table names one page's counts: {counts}"
    assert counts[0] == (str(len(above)), str(len(library) - len(above))), sorted(library)
    assert lua[0] == str(len(scripts)), sorted(scripts)
