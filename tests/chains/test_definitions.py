"""Chains as users define them (`chains.define`, `chains.chain_from_dict`,
`chains.load_chain_file`): validated against the endpoints, with every site loaded."""

from __future__ import annotations

import json
from functools import partial
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

import sites
from base_task import Item, Params
from chains import chain_from_dict, load_chain_file, step
from exceptions import (
    ChainCycleError,
    ChainDefinitionError,
    MissingMappingError,
    UnknownFieldError,
    UnknownTaskError,
)
from ledger import model
from ledger.model import fan_out

Chain = partial(model.Chain, lookup=sites.get_endpoint)  # as `chains.define` builds them


def tree() -> model.Chain:
    return Chain(
        "t",
        step("testsite.local.listing").then(
            step("testsite.local.detail", entry_id="entry_id"),
            step("testsite.local.reviews", entry_id="entry_id", const={"delay": 0.1}),
        ),
    )


def test_valid_chain_gets_step_ids_and_round_trips() -> None:
    ch = tree()
    assert list(ch.steps) == ["local.listing", "local.detail", "local.reviews"]
    again = chain_from_dict(json.loads(ch.to_json()))
    assert again.to_dict() == ch.to_dict()


def test_unknown_task_is_named_with_a_suggestion() -> None:
    with pytest.raises(UnknownTaskError, match=r"did you mean 'testsite.local.detail'"):
        Chain(
            "t",
            step("testsite.local.listing").then(step("testsite.local.detial", entry_id="entry_id")),
        )


def test_required_parameter_without_mapping() -> None:
    with pytest.raises(MissingMappingError, match="'entry_id'"):
        Chain("t", step("testsite.local.listing").then(step("testsite.local.detail")))


def test_mapping_from_a_field_the_parent_lacks() -> None:
    with pytest.raises(UnknownFieldError, match="'entry'"):
        Chain(
            "t",
            step("testsite.local.listing").then(step("testsite.local.detail", entry_id="entry")),
        )


def test_mapping_to_a_parameter_the_child_lacks() -> None:
    with pytest.raises(ChainDefinitionError, match="no parameter 'post_id'"):
        Chain(
            "t",
            step("testsite.local.listing").then(step("testsite.local.detail", post_id="entry_id")),
        )


def test_bad_constant_type_is_caught_when_defined() -> None:
    with pytest.raises(ChainDefinitionError, match="constant delay"):
        Chain(
            "t",
            step("testsite.local.listing").then(
                step("testsite.local.reviews", entry_id="entry_id", const={"delay": "slow"})
            ),
        )


@pytest.mark.parametrize(
    ("const", "why"),
    [({"page": True}, "valid integer"), ({"page": "2"}, "valid integer"),
     ({"per": 2.5}, "valid integer"), ({"page": object()}, "not JSON")],
)  # fmt: skip
def test_a_root_constant_is_checked_strictly_when_defined(const: dict, why: str) -> None:
    """The root's constants are checked like every step's, and strictly: a lax check would
    turn `page: true` into 1, and a root constant used to fail only at trigger."""
    with pytest.raises(ChainDefinitionError, match=why):
        Chain("t", step("testsite.local.listing", const=const))


def test_a_constant_of_a_graph_step_is_checked_strictly() -> None:
    data = {"name": "g", "root": "a", "steps": {
        "a": {"task": "testsite.local.listing", "next": ["b"]},
        "b": {"task": "testsite.local.reviews", "map": {"entry_id": "entry_id"},
              "const": {"page": True}},
    }}  # fmt: skip
    with pytest.raises(ChainDefinitionError, match="constant page=True"):
        model.chain_from_dict(data, lookup=sites.get_endpoint)


def test_constants_that_fit_their_types_pass() -> None:
    ch = Chain("t", step("testsite.local.listing", const={"page": 3, "per": None}).then(
        step("testsite.local.reviews", entry_id="entry_id", const={"delay": 1})))  # fmt: skip
    assert ch.root.const == {"page": 3, "per": None}  # an int is a float too (`delay`)


def test_cycle_in_graph_form() -> None:
    data = {
        "name": "loop",
        "root": "a",
        "steps": {
            "a": {"task": "testsite.local.listing", "next": ["b"]},
            "b": {"task": "testsite.local.detail", "map": {"entry_id": "entry_id"}, "next": ["a"]},
        },
    }
    with pytest.raises(ChainCycleError, match="a -> b -> a"):
        chain_from_dict(data)


def test_same_step_object_reused_is_a_cycle() -> None:
    a = step("testsite.local.listing")
    a.then(a)
    with pytest.raises(ChainCycleError):
        Chain("t", a)


@pytest.mark.parametrize(
    ("data", "msg"),
    [
        ([], "must be a mapping"),
        ({"root": {"task": "x"}}, "no 'name'"),
        ({"name": "x"}, "needs 'root'"),
        ({"name": "x", "root": {"task": "testsite.local.listing", "colour": 1}}, "unknown keys"),
        ({"name": "x", "root": {"task": "testsite.local.listing", "then": {}}}, "must be a list"),
        ({"name": "x", "root": {"task": "testsite.local.listing", "options": {"max_pages": "x"}}}, "option 'max_pages': Input should be a valid integer"),
        ({"name": "x", "root": {"task": "testsite.local.listing", "options": {"uniqe": True}}}, "root: step 'testsite.local.listing': unknown step option 'uniqe'; did you mean 'unique'"),
        ({"name": "x", "root": {"task": "testsite.local.listing", "options": [1]}}, "options must be a mapping"),
        ({"name": "x", "root": "a", "steps": {"a": {"task": "testsite.local.listing", "next": ["z"]}}}, "unknown step 'z'"),
    ],
)  # fmt: skip
def test_malformed_definitions_get_clear_errors(data, msg) -> None:
    with pytest.raises(ChainDefinitionError, match=msg):
        chain_from_dict(data)


@pytest.mark.parametrize(
    ("options", "msg"),
    [
        ({"uniqe": True}, r"step 'testsite.local.detail': unknown step option 'uniqe'; did you mean 'unique'\?"),
        ({"priority": "high"}, r"step 'testsite.local.detail': option 'priority': Input should be a valid integer.* \(got 'high'\)"),
    ],
)  # fmt: skip
def test_a_wrong_step_option_in_the_dsl_names_the_step_and_the_option(options, msg) -> None:
    with pytest.raises(ChainDefinitionError, match=msg):
        step("testsite.local.detail", _options=options)


def test_yaml_and_json_files(tmp_path) -> None:
    y = tmp_path / "c.yaml"
    y.write_text(
        "name: from_yaml\n"
        "root:\n"
        "  task: testsite.local.listing\n"
        "  then:\n"
        "    - task: testsite.local.detail\n"
        "      map: {entry_id: entry_id}\n"
    )
    assert list(load_chain_file(y).steps) == ["local.listing", "local.detail"]
    j = tmp_path / "c.json"
    j.write_text(json.dumps(tree().to_dict()))
    assert load_chain_file(j).to_dict() == tree().to_dict()
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ChainDefinitionError, match="not valid YAML"):
        load_chain_file(bad)


def test_fan_out_maps_fields_and_adds_constants() -> None:
    ch = tree()
    reviews = ch.steps["local.reviews"]
    items = [
        ("testsite.entry", {"entry_id": "e1", "n": 0}),
        ("testsite.entry", {"entry_id": "e2", "n": 1}),
    ]
    assert list(fan_out(reviews, items)) == [
        {"entry_id": "e1", "delay": 0.1},
        {"entry_id": "e2", "delay": 0.1},
    ]


def test_fan_out_skips_items_without_the_fields_and_honours_on() -> None:
    s = step("testsite.local.detail", entry_id="entry_id", options={"on": "testsite.entry"})
    items: list[tuple[str, dict[str, Any]]] = [
        ("testsite.entry", {"entry_id": "e1"}),
        ("other", {"entry_id": "x"}),
        ("testsite.entry", {"n": 1}),
    ]
    assert list(fan_out(s, items)) == [{"entry_id": "e1"}]


def by_id_lookup() -> Any:
    """An endpoint whose parameters are named like step()'s old keywords."""

    class ByIdParams(Params):
        id: str
        const: str = ""
        options: str = ""

    detail = sites.get_endpoint("testsite.local.detail")
    by_id = SimpleNamespace(params=ByIdParams, item_types=detail.item_types)
    return lambda task: by_id if task == "t.by_id" else sites.get_endpoint(task)


def test_no_parameter_name_is_reserved() -> None:
    """`id=`, `const=` and `options=` given a field name map parameters of those names; the
    step's own settings are `_id`, `_const`, `_options`."""
    lookup = by_id_lookup()
    kid = step("t.by_id", id="entry_id", const="n", options="n", _id="by_id",
               _options={"unique": True})  # fmt: skip
    ok = model.Chain("t", step("testsite.local.listing").then(kid), lookup=lookup)
    s = ok.steps["by_id"]
    assert s.map == {"id": "entry_id", "const": "n", "options": "n"}
    assert s.options.unique and s.const == {}
    assert list(fan_out(s, [("testsite.entry", {"entry_id": "e1", "n": 3})])) == [
        {"id": "e1", "const": 3, "options": 3}
    ]
    with pytest.raises(MissingMappingError) as err:
        model.Chain("t", step("testsite.local.listing").then(step("t.by_id")), lookup=lookup)
    assert (
        """required parameter 'id' of t.by_id has no mapping from testsite.local.listing's items (add id="<field>")"""
        in str(err.value)
    )


def test_the_old_const_and_options_keywords_still_work() -> None:
    """Chains written with `const={...}` / `options={...}` (a mapping, never a field name)."""
    ch = Chain("t", step("testsite.local.listing", options={"max_pages": 1}).then(
        step("testsite.local.reviews", entry_id="entry_id", const={"delay": 0.5})))  # fmt: skip
    assert ch.root.options.max_pages == 1
    assert ch.steps["local.reviews"].const == {"delay": 0.5}
    with pytest.raises(ChainDefinitionError, match="both options= and _options= given"):
        step("testsite.local.listing", options={"max_pages": 1}, _options={"unique": True})


def test_the_old_step_id_keyword_is_named_in_the_error() -> None:
    with pytest.raises(ChainDefinitionError) as err:
        Chain("t", step("testsite.local.listing").then(step("testsite.local.detail", entry_id="entry_id", id="d")))  # fmt: skip
    assert "has no parameter 'id'" in str(err.value)
    assert "the step's own id is _id=" in str(err.value)
    assert "local.detail" in str(err.value)


def test_a_mapping_on_the_root_step_is_an_error_naming_step_and_parameter() -> None:
    """It used to be ignored: the root's parameters come from the seeds."""
    with pytest.raises(ChainDefinitionError) as err:
        Chain("t", step("testsite.local.listing", page="2"))
    assert str(err.value) == (
        "chain 't', step 'local.listing': parameter 'page' maps from parent field '2', but the "
        "root step has no parent (its parameters come from the seeds; a fixed value goes in "
        "_const={'page': ...})"
    )
    with pytest.raises(ChainDefinitionError, match=r"step 'local\.listing': parameter 'page'"):
        chain_from_dict(
            {"name": "t", "root": {"task": "testsite.local.listing", "map": {"page": "p"}}}
        )


def test_a_mapping_value_that_is_no_field_name_is_an_error() -> None:
    with pytest.raises(ChainDefinitionError) as err:
        step("testsite.local.listing", page=2)
    assert (
        "step 'testsite.local.listing': parameter 'page' must map from a parent item field's name, got int 2"
        in str(err.value)
    )


def test_a_mapping_no_single_parent_item_type_satisfies_is_an_error() -> None:
    """Each field exists on some item of the parent, none has both: the step would never run."""

    class A(Item):
        item_type: ClassVar[str] = "t.a"
        key_fields: ClassVar[tuple[str, ...]] = ("a",)
        a: str

    class B(Item):
        item_type: ClassVar[str] = "t.b"
        key_fields: ClassVar[tuple[str, ...]] = ("b",)
        b: str

    class TwoParams(Params):
        x: str
        y: str

    ends = {"t.parent": SimpleNamespace(params=TwoParams, item_types=(A, B)),
            "t.two": SimpleNamespace(params=TwoParams, item_types=())}  # fmt: skip
    with pytest.raises(UnknownFieldError) as err:
        model.Chain(
            "t", step("t.parent").then(step("t.two", x="a", y="b")), lookup=ends.__getitem__
        )
    assert "step 't.two'" in str(err.value) and "['a', 'b']" in str(err.value)
    model.Chain("t", step("t.parent").then(step("t.two", x="a", y="a")), lookup=ends.__getitem__)
