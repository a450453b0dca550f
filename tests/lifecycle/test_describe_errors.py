"""Validation errors in one line name the value each field rejected, as JSON and cut short:
a seed `{"page": "2"}` is refused because "2" is a string, which the message shows."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from lifecycle.endpoints import SHOWN_INPUT, describe, shown_input


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    page: int = 1
    title: str = ""


def error(**data: object) -> ValidationError:
    with pytest.raises(ValidationError) as err:
        Model.model_validate(data)
    return err.value


def test_the_rejected_value_is_shown_as_json() -> None:
    assert describe(error(page="2")) == "field 'page': Input should be a valid integer (got \"2\")"
    assert describe(error(title=None)) == "field 'title': Input should be a valid string (got null)"


def test_a_long_value_is_cut() -> None:
    shown = shown_input("x" * 500)
    assert len(shown) == SHOWN_INPUT and shown.endswith("...")


def test_unknown_fields_keep_their_did_you_mean_without_a_value() -> None:
    assert describe(error(pgae=2), Model) == "field 'pgae': unknown field; did you mean 'page'?"
