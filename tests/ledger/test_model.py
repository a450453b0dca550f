"""The chain as data: steps, mappings, fan-out (validation against endpoints: tests/chains)."""

from __future__ import annotations

from ledger.model import Chain, chain_from_dict, fan_out, step


def test_a_parameter_named_like_a_keyword_of_step_is_mapped_through_the_dict() -> None:
    s = step("demo.app.detail", {"id": "post_id", "options": "opts", "const": "c"}, page="n")
    assert s.map == {"id": "post_id", "options": "opts", "const": "c", "page": "n"}
    assert s.id == "" and s.const == {}
    assert list(fan_out(s, [("demo.post", {"post_id": "p1", "opts": 1, "c": 2, "n": 3})])) == [
        {"id": "p1", "options": 1, "const": 2, "page": 3}
    ]
    tail = step("x.y.z", task="t", mapping="m")  # task and mapping are positional-only
    assert tail.task == "x.y.z" and tail.map == {"task": "t", "mapping": "m"}


def test_unvalidated_chains_round_trip_without_an_endpoint_lookup() -> None:
    ch = Chain("c", step("a.b.c").then(step("a.b.d", {"id": "x"})))
    again = chain_from_dict(ch.to_dict())
    assert again.to_dict() == ch.to_dict() and list(again.steps) == ["b.c", "b.d"]
