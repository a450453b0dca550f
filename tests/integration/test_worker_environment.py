"""A real worker names the CHAINCRAWL_* variables it will not read (settings/envcheck.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def test_worker_warns_of_a_misspelled_variable_without_its_value(
    start_worker: Callable[..., Any],
) -> None:
    w = start_worker(
        CHAINCRAWL_MAX_RETRYS="3",
        CHAINCRAWL_SIGN_KEY_TESTSITEE="s3cret-sign-key",
        CHAINCRAWL_SIGN_KEY_TESTSITE="s3cret-sign-key",  # read: not reported
    )
    want = [
        "environment: CHAINCRAWL_MAX_RETRYS is not a chaincrawl setting; "
        "did you mean CHAINCRAWL_MAX_RETRIES?",
        "environment: CHAINCRAWL_SIGN_KEY_TESTSITEE: no site 'testsitee'; "
        "did you mean CHAINCRAWL_SIGN_KEY_TESTSITE?",
    ]
    deadline = time.monotonic() + 15
    while not all(line in w.text() for line in want) and time.monotonic() < deadline:
        time.sleep(0.1)
    text = w.text()
    assert [line for line in want if line not in text] == []
    assert text.count("environment: ") == 2
    assert "s3cret" not in text
