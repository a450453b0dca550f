"""`items TYPE --run RID` that matches nothing: in the latest-version store a run whose keys a
later run stored again has no lines left, which the error says beside "a mistyped run id?"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import UserError
from cli.items import run
from external_interface.storage.sinks.base import Origin
from external_interface.storage.sinks.jsonl import JsonlSink
from settings.storage import reset_storage_settings

T = "shop.product"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    JsonlSink(tmp_path / "items", fsync=False).write(
        T, ["sku"], [{"sku": "a"}], origins=[Origin("1-0", "r1", "list", "shop.pc.list")]
    )
    monkeypatch.setenv("CHAINCRAWL_JSONL_DIR", str(tmp_path / "items"))
    reset_storage_settings()
    try:
        yield tmp_path / "items"
    finally:
        monkeypatch.undo()
        reset_storage_settings()


@pytest.mark.parametrize("mode", ["latest", "append"])
def test_no_items_of_a_run_says_what_latest_mode_keeps(
    store: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv("CHAINCRAWL_JSONL_MODE", mode)
    reset_storage_settings()
    with pytest.raises(UserError) as err:
        run(T, run_id="r0")
    msg = str(err.value)
    assert msg.startswith("run r0 stored no items in the JSONL store at ") and "mistyped" in msg
    assert ("CHAINCRAWL_JSONL_MODE=latest keeps the latest version" in msg) == (mode == "latest")
