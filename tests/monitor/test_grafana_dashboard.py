"""The Grafana dashboard in the repository (monitor/grafana/chaincrawl.json) queries only
metrics the exporter exports, and imports as Grafana expects (a datasource input)."""

from __future__ import annotations

import json
import re

import orjson
import redis
from prometheus_client.exposition import generate_latest

from config import ROOT, Settings
from monitor.alerts import Keys
from monitor.exporter import make_registry
from tests.monitor.test_exporter import populated  # noqa: F401 - fixture

DASHBOARD = ROOT / "monitor" / "grafana" / "chaincrawl.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported(rds: redis.Redis, s: Settings) -> set[str]:
    """Every series name a scrape can hold (each family's name with its type's suffixes)."""
    text = generate_latest(make_registry(rds, s)).decode()
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        base = name.removesuffix("_total") if kind == "counter" else name
        names.update(base + suffix for suffix in SUFFIXES.get(kind, ("",)))
    return names


def queried(dashboard: dict) -> set[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    return set(re.findall(r"\bchaincrawl_[a-z_]+", " ".join(exprs)))


def test_every_metric_the_dashboard_queries_is_exported(rds, populated) -> None:  # noqa: F811
    # the worker count is exported once the monitor has pinged the workers
    rds.set(Keys(populated).workers, orjson.dumps({"workers": ["w1@host"], "at": 0}))
    dashboard = json.loads(DASHBOARD.read_text())
    wanted = queried(dashboard)
    assert len(wanted) >= 15  # pages, items, errors, latency, pools, queues, outbox, runs, ...
    missing = wanted - exported(rds, populated)
    assert not missing, f"the dashboard queries metrics the exporter does not export: {missing}"


def test_it_imports_with_a_prometheus_datasource_input() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert [i["pluginId"] for i in dashboard["__inputs"]] == ["prometheus"]
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert uids == {"${DS_PROMETHEUS}"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
