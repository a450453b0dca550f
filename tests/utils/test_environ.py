"""`utils.environ` sets variables for a while and puts back exactly what was there."""

from __future__ import annotations

import os

import pytest

from utils import environ


def test_patched_restores_set_and_unset_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAINCRAWL_T_SET", "before")
    monkeypatch.delenv("CHAINCRAWL_T_UNSET", raising=False)
    with environ.patched({"CHAINCRAWL_T_SET": "during", "CHAINCRAWL_T_UNSET": "during"}):
        assert os.environ["CHAINCRAWL_T_SET"] == os.environ["CHAINCRAWL_T_UNSET"] == "during"
    assert os.environ["CHAINCRAWL_T_SET"] == "before"
    assert "CHAINCRAWL_T_UNSET" not in os.environ


def test_restore_runs_when_the_body_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHAINCRAWL_T_UNSET", raising=False)
    with pytest.raises(RuntimeError), environ.patched({"CHAINCRAWL_T_UNSET": "x"}):
        raise RuntimeError
    assert "CHAINCRAWL_T_UNSET" not in os.environ
