"""`utils.slots`: a lost slot range read from a CLUSTER NODES reply, and its reason."""

from __future__ import annotations

import logging

from monitor.alert_observations import Observation, Sample, causes, rule_values
from monitor.alert_rules import Rule
from utils.outage import Outage, OutageFilter
from utils.slots import LostRange, SlotsLost, lost_for, node_addresses, parse_nodes, reason

NODES = """\
a1 127.0.0.1:17101@27101 master - 0 0 1 connected 0-5460
a2 127.0.0.1:17102@27102 master,fail - 0 0 2 disconnected 5461-10922
a3 127.0.0.1:17103@27103 myself,master - 0 0 3 connected 10923-16383
b1 127.0.0.1:17104@27104 slave a1 0 0 1 connected
b2 127.0.0.1:17105@27105 slave,fail a2 0 0 2 disconnected
b3 127.0.0.1:17106@27106 slave a3 0 0 3 connected
"""


def test_a_failed_master_with_its_replica_down_is_a_lost_range() -> None:
    lost = parse_nodes(NODES)
    assert lost == [LostRange(5461, 10922, "127.0.0.1:17102", ("127.0.0.1:17105",))]
    assert reason(lost) == (
        "slots 5461-10922 lost: 127.0.0.1:17102 and its replica 127.0.0.1:17105 do not answer"
    )
    assert str(SlotsLost(lost)) == reason(lost)


def test_a_failover_under_way_is_not_a_loss() -> None:
    """The master failed, its replica answers (to be promoted): nothing lost."""
    assert parse_nodes(NODES.replace("slave,fail a2", "slave a2")) == []
    assert parse_nodes(NODES.replace("master,fail", "master")) == []


def test_a_key_on_the_lost_range_is_found() -> None:
    lost = parse_nodes(NODES)
    # {c} hashes to slot 7365, {b} to 3300
    assert lost_for(lost, "run:{c}:x") == lost[0]
    assert lost_for(lost, "run:{b}:x") is None


def test_the_alert_names_the_range_and_its_runs() -> None:
    rule = Rule(name="slots_lost", kind="slots_lost", above=-1)
    obs = Observation(Sample(0.0, {}, {}, 0), {}, {}, [], lost={"5461-10922": (2, "why")})
    assert rule_values(rule, obs, None) == {"5461-10922": 2.0}
    assert causes(rule, obs) == {"5461-10922": "why"}


def test_celerys_retry_line_for_a_parked_message_is_held_back() -> None:
    f = OutageFilter(Outage())
    exc = SlotsLost(parse_nodes(NODES))
    rec = logging.LogRecord("celery.app.trace", logging.INFO, "", 0,
                            "Task %(name)s[%(id)s] retry: %(exc)s",
                            ({"id": "1", "name": "t", "exc": f"Retry in 10s: {exc!r}"},), None)  # fmt: skip
    assert not f.filter(rec)


def test_a_node_listed_without_an_address_keeps_its_name() -> None:
    """A node down for long can be listed as `:0@0`: named from an earlier reply or another
    node's, else by its id, never as `:0` (the reason stays the same through the outage)."""
    text = NODES.replace("127.0.0.1:17105@27105", ":0@0")
    named = [LostRange(5461, 10922, "127.0.0.1:17102", ("127.0.0.1:17105",))]
    assert parse_nodes(text, node_addresses(NODES)) == named
    assert node_addresses(text).get("b2") is None
    assert parse_nodes(text)[0].replicas == ("node b2",)
