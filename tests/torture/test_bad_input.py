"""Bad input, each with a clear error and no worker crash.

One worker (threads pool) serves the `torture` endpoints (tests/torture/site) against the
bad-pages server (tests/torture/badsite.py), with a 1 MB response limit and items going to
JSONL and MongoDB (nx-27017). Covered:

- malformed chain definitions and seeds, parameters failing their schema (at trigger time, in
  a raw task message, and when a parent's item maps a bad value into a child's parameter);
- malformed HTML and JSON, invalid encodings, responses over the size limit (declared,
  chunked, a gzip bomb), redirect loops and chains: one run with every page as a seed;
- a page that crashes its parser every time: dead-lettered after its retries, never
  redelivered again;
- garbage task messages (not JSON, wrong arguments, unknown task): the worker lives on;
- field names hostile to the store (`$where`, `a.b`, `$set`, NUL) in items.

After each test the worker must still be the same live process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pymongo
import pytest

import chains
from base_task import get_endpoint
from chains import Chain, chain_from_dict, load_chain_file, step
from config import get_settings
from exceptions import (
    ChainCycleError,
    ChainDefinitionError,
    MissingMappingError,
    ParamsError,
    UnknownFieldError,
    UnknownTaskError,
)
from external_interface.storage.routing import restore_keys
from external_interface.storage.sinks.jsonl import iter_records
from monitor.deadletter import DeadLetter, DeadLetterStore
from tests.external_interface.mongo_server import MongoServer
from tests.torture.badsite import GBK_TITLE, HOSTILE_ATTRS, HOSTILE_TAGS, BadSite
from tests.torture.harness import Fleet, Worker, base_env, process_env, wait_complete, wait_for
from utils.redis import get_redis
from utils.servers import RedisServer

pytestmark = pytest.mark.integration

LIMIT = 1024 * 1024  # CHAINCRAWL_MAX_RESPONSE_BYTES of the worker
PAGE_RETRIES = 2  # torture.local.page max_retries
DB = "torture_bad"


@dataclass
class World:
    env: dict[str, str]
    site: BadSite
    mongo_url: str
    var: Path
    worker: Worker
    prefix: str


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("bad")
    redis_server = RedisServer(root / "redis").start()
    site = BadSite().start()
    mongo = MongoServer(root / "nx").start()
    var, logs = root / "var", root / "logs"
    var.mkdir()
    logs.mkdir()
    env = base_env(
        redis_server.url, var, "tb",
        TORTURE_SITE_URL=site.url,
        CHAINCRAWL_MAX_RESPONSE_BYTES=str(LIMIT),
        CHAINCRAWL_SINKS="jsonl,mongo",
        CHAINCRAWL_MONGO_URL=mongo.url,
        CHAINCRAWL_MONGO_DB=DB,
        CHAINCRAWL_MAX_RETRIES="2",
    )  # fmt: skip
    fleet = Fleet(env, logs, queues="torture", concurrency=4)
    try:
        with process_env(env):
            (worker,) = fleet.start(1)
            yield World(env, site, mongo.url, var, worker, "tb")
    finally:
        fleet.stop()
        mongo.stop()
        site.stop()
        redis_server.kill()


@pytest.fixture
def alive(world: World) -> Iterator[World]:
    """Every test ends with the same worker process alive and still taking tasks."""
    pid = world.worker.pid
    yield world
    assert world.worker.alive() and world.worker.pid == pid, world.worker.text()[-3000:]
    h = chains.run(Chain("torture_ping", step("torture.local.typed")), seeds=[{"n": 7}])
    assert wait_complete(h, timeout=30).totals["succeeded"] == 1


def dead_letters(run_id: str) -> list[DeadLetter]:
    return [d for d in DeadLetterStore(get_redis()).list(10_000) if d.meta.get("run") == run_id]


# --- definitions and seeds (no worker involved) -----------------------------------------------


BAD_CHAINS: list[tuple[Any, type[Exception], str]] = [
    ([1, 2], ChainDefinitionError, "must be a mapping"),
    ({"root": {"task": "torture.local.page"}}, ChainDefinitionError, "no 'name'"),
    ({"name": "x"}, ChainDefinitionError, "needs 'root'"),
    ({"name": "x", "root": "torture.local.page"}, ChainDefinitionError, "must be a mapping"),
    ({"name": "x", "root": {"task": 42}}, ChainDefinitionError, "no 'task'"),
    ({"name": "x", "root": {"task": "torture.local.nope"}}, UnknownTaskError, "torture.local.nope"),
    ({"name": "x", "root": {"task": "torture.local.page", "colour": 1}}, ChainDefinitionError,
     "unknown keys ['colour'] (a step's keys: "),
    ({"name": "x", "root": {"task": "torture.local.page", "thne": []}}, ChainDefinitionError,
     "root has unknown keys ['thne'] (did you mean 'then'?)"),
    ({"name": "x", "root": "a", "steps": {"a": {"task": "torture.local.page", "nxt": [], "mpa": {}}}},
     ChainDefinitionError, "steps.a has unknown keys ['mpa', 'nxt'] (did you mean 'map' for 'mpa', 'next' for 'nxt'?)"),
    ({"name": "x", "root": {"task": "torture.local.page", "then": {"task": "a"}}},
     ChainDefinitionError, "then must be a list"),
    ({"name": "x", "root": {"task": "torture.local.page", "options": {"max_pages": "lots"}}},
     ChainDefinitionError, "option 'max_pages': Input should be a valid integer"),
    ({"name": "x", "root": {"task": "torture.local.page", "map": ["path"]}},
     ChainDefinitionError, "map must be a mapping"),
    ({"name": "x", "root": {"task": "torture.local.emit", "then": [{"task": "torture.local.typed"}]}},
     MissingMappingError, "required parameter 'n'"),
    ({"name": "x", "root": {"task": "torture.local.emit",
                            "then": [{"task": "torture.local.typed", "map": {"n": "nope"}}]}},
     UnknownFieldError, "field 'nope'"),
    ({"name": "x", "root": {"task": "torture.local.emit",
                            "then": [{"task": "torture.local.typed", "map": {"m": "value"}}]}},
     ChainDefinitionError, "no parameter 'm'"),
    ({"name": "x", "root": {"task": "torture.local.emit",
                            "then": [{"task": "torture.local.typed", "const": {"n": "abc"}}]}},
     ChainDefinitionError, "constant n='abc' is invalid"),
    ({"name": "x", "root": "a", "steps": {"a": {"task": "torture.local.emit", "next": ["b"]},
                                          "b": {"task": "torture.local.emit", "next": ["a"]}}},
     ChainCycleError, "a -> b -> a"),
    ({"name": "x", "root": "a", "steps": {"a": {"task": "torture.local.emit", "next": ["zz"]}}},
     ChainDefinitionError, "unknown step 'zz'"),
    ({"name": "x", "root": "q", "steps": {"a": {"task": "torture.local.emit"}}},
     ChainDefinitionError, "'root' must name one of the steps"),
]  # fmt: skip


@pytest.mark.parametrize(
    "data, error, text", BAD_CHAINS, ids=[str(i) for i in range(len(BAD_CHAINS))]
)
def test_malformed_chain_definition_is_refused_clearly(
    world: World, data: Any, error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as ei:
        chain_from_dict(data)
    assert text in str(ei.value)


@pytest.mark.parametrize(
    "name, content, text",
    [
        ("bad.yaml", "name: x\nroot: {task: [unclosed", "not valid YAML"),
        ("bad.json", '{"name": "x", "root": ', "not valid JSON"),
        ("empty.yaml", "", "must be a mapping"),
        ("missing.yaml", None, "cannot read chain file"),
    ],
)
def test_malformed_chain_file_is_refused_clearly(
    world: World, tmp_path: Path, name: str, content: str | None, text: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ChainDefinitionError) as ei:
        load_chain_file(path)
    assert text in str(ei.value)


PAGE = {"name": "torture_pages", "root": {"task": "torture.local.page"}}


@pytest.mark.parametrize(
    "seeds, text",
    [
        ([{"path": 1}], "seed 0: torture.local.page: field 'path'"),
        ([{"path": "/x"}, {"nope": 1}], "seed 1: torture.local.page: field 'path': Field required"),
        ([{"path": "/x", "kind": "xml"}], "field 'kind'"),
        ([], "no seeds given"),
    ],
)
def test_bad_seeds_are_refused_before_anything_is_sent(world: World, seeds: Any, text: str) -> None:
    before = get_redis().dbsize()
    with pytest.raises(ParamsError) as ei:
        chains.run(chain_from_dict(PAGE), seeds=seeds)
    assert text in str(ei.value)
    assert get_redis().dbsize() == before  # no run record, no message


@pytest.mark.parametrize(
    "seeds", [[1], ["u1"], "abc", [None]], ids=["int", "str", "string", "none"]
)
def test_seed_that_is_not_an_object_is_a_params_error(world: World, seeds: Any) -> None:
    with pytest.raises(ParamsError) as ei:
        chains.run(chain_from_dict(PAGE), seeds=seeds)
    # a string is no list of seeds (its letters were taken as seeds): said as such
    said = "seeds must be a list of parameter objects" if isinstance(seeds, str) else "seed 0"
    assert said in str(ei.value)


def test_bad_priority_is_refused(world: World) -> None:
    with pytest.raises(ParamsError, match=r"priority must be 0\.\.9"):
        chains.run(chain_from_dict(PAGE), seeds=[{"path": "/html/ok"}], priority=12)


# --- bad pages: one run, every case a seed -----------------------------------------------------

OK = "item"

CASES: dict[str, tuple[str, str, Any]] = {
    # id: (path, kind, expected)  expected: OK text check | (error type, attempts)
    "html-ok": ("/html/ok", "html", "fine"),
    "html-broken": ("/html/broken", "html", "broken but readable"),
    "html-missing": ("/html/missing", "html", ("ParseError", PAGE_RETRIES + 1)),
    "html-binary": ("/html/binary", "html", ("ParseError", PAGE_RETRIES + 1)),
    "html-empty": ("/html/empty", "html", ("ParseError", PAGE_RETRIES + 1)),
    "json-ok": ("/json/ok", "json", "fine"),
    "json-truncated": ("/json/truncated", "json", ("MalformedBody", 1)),
    "json-notjson": ("/json/notjson", "json", ("MalformedBody", 1)),
    "json-badutf8": ("/json/badutf8", "json", ("MalformedBody", 1)),
    "json-deep": ("/json/deep", "json", ("MalformedBody", 1)),
    "json-array": ("/json/array", "json", ("ParseError", PAGE_RETRIES + 1)),
    "json-nan": ("/json/nan", "json", ("MalformedBody", 1)),
    "json-empty": ("/json/empty", "json", ("MalformedBody", 1)),
    "enc-bad-utf8": ("/enc/bad-utf8", "html", lambda t: t.startswith("caf\ufffd") and "ok" in t),
    "enc-bogus-charset": ("/enc/bogus-charset", "html", "plain ascii"),
    "enc-gbk-as-utf8": ("/enc/gbk-as-utf8", "html", lambda t: "\ufffd" in t and t != GBK_TITLE),
    "enc-gbk-meta": ("/enc/gbk-meta", "html", GBK_TITLE),
    "enc-utf16": ("/enc/utf16", "html", "wide"),  # NULs between the letters are dropped
    "too-large": ("/big", "text", ("ResponseTooLarge", 1)),
    "too-large-chunked": ("/big-chunked", "text", ("ResponseTooLarge", 1)),
    "gzip-bomb": ("/gzip-bomb", "text", ("ResponseTooLarge", 1)),
    "redirect-loop": ("/redirect-loop", "html", ("TooManyRedirects", 1)),
    "redirect-chain-30": ("/redirect-chain/30", "html", ("TooManyRedirects", 1)),
    "redirect-chain-3": ("/redirect-chain/3", "html", "end of chain"),
    "item-invalid": ("/html/ok?badout", "badout", ("ItemValidationError", 1)),
}

# besides the path of the page, the dead letter's error names what was wrong
ERROR_WORDS = {
    "ParseError": (),
    "MalformedBody": ("invalid JSON", "HTTP 200"),  # a 200's broken JSON: no refetch
    "ResponseTooLarge": ("limit", str(LIMIT)),
    "TooManyRedirects": ("redirects",),
    "ItemValidationError": ("torture.local.page: item invalid", "field 'text'"),
}


@dataclass
class Outcome:
    stored: dict[str, dict[str, Any]]  # path -> item
    dead: dict[str, DeadLetter]  # path -> dead letter
    totals: dict[str, int]


@pytest.fixture(scope="module")
def bad_pages(world: World) -> Outcome:
    seeds = [{"path": path, "kind": kind} for path, kind, _ in CASES.values()]
    handle = chains.run(chain_from_dict(PAGE), seeds=seeds)
    p = wait_complete(handle, timeout=120)
    stored = {
        r["item"]["path"]: r["item"] for r in iter_records("torture.page", world.var / "items")
    }
    dead = {d.params["path"]: d for d in dead_letters(handle.run_id)}
    return Outcome(stored, dead, p.totals)


def test_bad_pages_run_completes(bad_pages: Outcome) -> None:
    n_ok = sum(1 for *_, e in CASES.values() if not isinstance(e, tuple))
    t = bad_pages.totals
    assert t["dispatched"] == len(CASES)
    assert t["succeeded"] == t["items"] == t["stored"] == n_ok
    assert t["failed"] == len(CASES) - n_ok
    expected_retries = sum(e[1] - 1 for *_, e in CASES.values() if isinstance(e, tuple))
    assert t["retried"] == expected_retries


@pytest.mark.parametrize("case", list(CASES))
def test_bad_page(case: str, bad_pages: Outcome, alive: World) -> None:
    path, _kind, expected = CASES[case]
    hits = alive.site.hits[path.split("?")[0]]
    if not isinstance(expected, tuple):
        item = bad_pages.stored.get(path)
        assert item is not None, f"{path} was not stored; dead letter: {bad_pages.dead.get(path)}"
        assert expected(item["text"]) if callable(expected) else item["text"] == expected, item
        assert path not in bad_pages.dead
        return
    error_type, attempts = expected
    dl = bad_pages.dead.get(path)
    assert dl is not None, f"{path}: no dead letter (stored: {bad_pages.stored.get(path)})"
    assert dl.error_type == error_type, (dl.error_type, dl.error)
    assert dl.retries == attempts - 1
    where = () if error_type == "ItemValidationError" else (path.split("?")[0],)
    for word in (*ERROR_WORDS[error_type], *where):
        assert word in dl.error, dl.error  # the message says what went wrong, and where
    assert dl.traceback
    if case.startswith("redirect"):
        assert hits >= 1
    elif case != "item-invalid":
        assert hits == attempts, f"{path}: fetched {hits} times, expected {attempts}"
    if case == "enc-gbk-meta":
        assert bad_pages.stored[path]["encoding"] == "gb18030"


# --- a parser that crashes every time -----------------------------------------------------------


def test_parser_crash_is_dead_lettered_after_its_retries_and_never_redelivered(
    alive: World,
) -> None:
    tokens = ["c1", "c2"]
    ch = Chain("torture_crash", step("torture.local.crash"))
    handle = chains.run(ch, seeds=[{"token": t} for t in tokens])
    p = wait_complete(handle, timeout=90)
    max_retries = get_endpoint("torture.local.crash").max_retries
    assert max_retries == 3
    assert p.totals["failed"] == len(tokens) and p.totals["succeeded"] == 0
    assert p.totals["retried"] == len(tokens) * max_retries
    dls = dead_letters(handle.run_id)
    assert sorted(d.params["token"] for d in dls) == tokens
    for d in dls:
        assert d.error_type == "ZeroDivisionError" and d.retries == max_retries
        assert "crash.py" in d.traceback and "per_row" in d.traceback
    hits = {t: alive.site.hits[f"/crash/{t}"] for t in tokens}
    assert hits == dict.fromkeys(tokens, max_retries + 1)
    # not an endless loop: past a visibility timeout (8 s) and a restore sweep, nothing more
    time.sleep(12)
    assert {t: alive.site.hits[f"/crash/{t}"] for t in tokens} == hits
    r = get_redis()
    assert r.llen(f"{alive.prefix}:q:torture") == 0 and r.hlen(f"{alive.prefix}:q:unacked") == 0


# --- parameters failing their schema at run time ---------------------------------------------


def test_child_params_failing_their_schema_are_dead_lettered(alive: World) -> None:
    ch = Chain(
        "torture_typed", step("torture.local.emit").then(step("torture.local.typed", n="value"))
    )
    handle = chains.run(ch, seeds=[{"values": ["1", "abc", "2", "3.5"]}])
    p = wait_complete(handle, timeout=60)
    typed = p.steps["local.typed"]
    assert typed["dispatched"] == 4 and typed["succeeded"] == 2 and typed["failed"] == 2
    assert typed["retried"] == 0  # a schema error is not retried
    dls = {d.params["n"]: d for d in dead_letters(handle.run_id)}
    assert set(dls) == {"abc", "3.5"}
    for d in dls.values():
        assert d.error_type == "ParamsError"
        assert "torture.local.typed: field 'n'" in d.error


def test_raw_task_with_bad_params_is_dead_lettered(alive: World) -> None:
    from worker import app

    r = get_redis()
    ids: dict[str, tuple[Any, dict[str, Any]]] = {
        "not-an-object": ("just a string", {}),
        "wrong-type": ({"path": ["/html/ok"]}, {}),
        "unknown-field": ({"path": "/html/ok", "evil": "$where"}, {}),
    }
    for tid, args in ids.items():
        app.send_task("torture.local.page", args=args, task_id=f"bad-{tid}", queue="torture")
    store = DeadLetterStore(r)
    wait_for(lambda: all(store.get(f"bad-{t}") for t in ids), timeout=30, what="dead letters")
    for tid in ids:
        d = store.get(f"bad-{tid}")
        assert d is not None and d.error_type == "ParamsError" and d.retries == 0
        assert d.error.startswith("torture.local.page: ")


# --- garbage messages ---------------------------------------------------------------------------


def test_garbage_messages_leave_the_worker_running(alive: World) -> None:
    """Messages the worker cannot use are refused with an error in its log; it lives on.
    (More malformed payloads: test_crash_paths.py.)"""
    from worker import app

    r = get_redis()
    queue = f"{alive.prefix}:q:torture"
    r.lpush(queue, b'{"hello": "world"}')  # JSON, but no message
    r.lpush(
        queue,
        orjson.dumps({
            "body": "gAN9cQAu", "content-encoding": "binary",
            "content-type": "application/x-python-serialize",
            "headers": {"task": "torture.local.page", "id": "garbage-pickle", "lang": "py"},
            "properties": {"delivery_tag": "garbage-tag", "body_encoding": "base64",
                           "delivery_info": {"exchange": "", "routing_key": "torture"}},
        }),
    )  # fmt: skip
    # well-formed messages that cannot run: unknown task, wrong arguments, meta not an object
    app.send_task("torture.local.nope", args=({}, {}), queue="torture")
    app.send_task("torture.local.page", args=(1, 2, 3), queue="torture", task_id="bad-arity")
    app.send_task("torture.local.page", args=({"path": "/html/ok"}, "meta?"), queue="torture")
    wait_for(lambda: r.llen(queue) == 0, timeout=30, what="the garbage consumed")
    time.sleep(2)
    text = alive.worker.text()
    assert "Unrecoverable error" not in text
    assert "Refusing to deserialize untrusted content of type pickle" in text
    assert "Received unregistered task of type 'torture.local.nope'" in text
    assert "bad-arity] raised unexpected: TypeError" in text


# --- field names hostile to the store -----------------------------------------------------------


def test_hostile_field_names_are_stored_safely(alive: World) -> None:
    hids = ["h1", "$where", "a.b"]
    ch = Chain("torture_hostile", step("torture.local.hostile"))
    handle = chains.run(ch, seeds=[{"hid": h} for h in hids])
    p = wait_complete(handle, timeout=60)
    assert p.totals["succeeded"] == p.totals["stored"] == len(hids) and p.totals["failed"] == 0
    # JSONL keeps the names exactly as the page had them
    raw = {
        r["item"]["hid"]: r["item"] for r in iter_records("torture.hostile", alive.var / "items")
    }
    assert set(raw) == set(hids)
    assert all(i["attrs"] == HOSTILE_ATTRS and i["tags"] == HOSTILE_TAGS for i in raw.values())
    # MongoDB: nothing read as an operator or a path; the names come back with restore_keys
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        alive.mongo_url, serverSelectionTimeoutMS=5000
    )
    try:
        coll = client[DB]["torture_hostile"]
        docs = {d["hid"]: d for d in coll.find({})}
        assert set(docs) == set(hids) and coll.count_documents({}) == len(hids)
        for d in docs.values():
            assert "pwned" not in d and "$set" not in d["attrs"] and "\uff04set" in d["attrs"]
            assert "a\uff0eb" in d["attrs"] and "\uff04where" in d["attrs"]
            assert restore_keys(d["attrs"]) == HOSTILE_ATTRS
            assert restore_keys(d["tags"]) == HOSTILE_TAGS
        assert coll.count_documents({"hid": "$where"}) == 1  # a value, not an operator
    finally:
        client.close()
    assert get_settings().key_prefix == alive.prefix
