"""`new-site` by kind, as a user goes from nothing to a parser test: the generated files lint
and load, the site's base URL comes from its setting, `parse --save-fixture` records a page of
a local site, and each generated test (skipped before) replays it and passes offline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from cli import UserError
from cli.newsite import _written_base_url, generate, run
from config import ROOT
from tests.threaded_site import ThreadedSite


class KindsSite(ThreadedSite):
    """Pages shaped like the templates expect: an HTML list, HTML details, a JSON API."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/listing", self.listing)
        app.router.add_get("/thing/{id}", self.thing)
        app.router.add_get("/api/things", self.api)
        return app

    async def listing(self, req: web.Request) -> web.Response:
        page = int(req.query.get("page", "1"))
        rows = "".join(f'<div class="item" data-id="{page}-{i}"><a href="/thing/{page}-{i}">'
                       f"Thing {page}-{i}</a></div>" for i in range(3))  # fmt: skip
        nxt = f'<a class="next" href="?page={page + 1}">next</a>' if page < 2 else ""
        return web.Response(text=f"<html><body>{rows}{nxt}</body></html>", content_type="text/html")

    async def thing(self, req: web.Request) -> web.Response:
        return web.Response(text=f"<html><h1> Thing {req.match_info['id']} </h1></html>",
                            content_type="text/html")  # fmt: skip

    async def api(self, req: web.Request) -> web.Response:
        page = int(req.query.get("page", "1"))
        rows = [{"id": page * 10 + i, "title": f"Thing {page * 10 + i}"} for i in range(2)]
        return web.json_response({"items": rows, "next": page + 1 if page < 2 else None})


@pytest.fixture
def site_name(checkout_files: None) -> Iterator[str]:
    """A new site's name; the site is written into the checkout and removed after the test."""
    name = f"zzgen{uuid.uuid4().hex[:6]}"
    try:
        yield name
    finally:
        shutil.rmtree(ROOT / "sites" / name, ignore_errors=True)
        shutil.rmtree(ROOT / "tests/sites" / name, ignore_errors=True)


def pytest_run(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           *map(str, paths)], cwd=ROOT, capture_output=True, text=True)  # fmt: skip


@pytest.mark.integration
def test_each_kind_from_new_site_to_a_passing_recorded_test(
    site_name: str, redis_url: str, key_prefix: str
) -> None:
    site, env_name = site_name, f"CHAINCRAWL_BASE_URL_{site_name.upper()}"
    pages = KindsSite()
    pages.start()
    env = {**os.environ, "CHAINCRAWL_REDIS_URL": redis_url, "CHAINCRAWL_KEY_PREFIX": key_prefix}
    try:
        first = generate(site, "pc", "listing", kind="list", item="thing")  # no default URL
        out = subprocess.run([str(ROOT / "control.sh"), "new-site", site, "pc", "thing", "--kind",
                              "detail", "--item", "thing"], cwd=ROOT, env=env, capture_output=True,
                             text=True)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert f"created sites/{site}/pc/thing.py" in out.stdout
        assert f"kept sites/{site}/items.py (exists)" in out.stdout  # the class is there already
        assert f"{env_name} overrides it" in out.stdout
        third = generate(site, "app", "things", kind="api", item="gadget")
        items_py = ROOT / "sites" / site / "items.py"
        assert third.appended == [(items_py, "Gadget")]
        text = items_py.read_text()
        assert text.count("class Thing(Item)") == 1 and text.count("class Gadget(Item)") == 1

        written = [p for p in first.created + third.created if p.suffix == ".py"]
        written += [ROOT / "sites" / site / "pc" / "thing.py", items_py]
        rel = [str(p.relative_to(ROOT)) for p in written]
        ruff = str(ROOT / ".venv/bin/ruff")
        assert subprocess.run([ruff, "check", *rel], cwd=ROOT).returncode == 0
        assert subprocess.run([ruff, "format", "--check", *rel], cwd=ROOT).returncode == 0
        mine = sorted({r for r in rel if r.startswith("sites/")})  # `./control.sh lint` checks them
        assert subprocess.run([str(ROOT / ".venv/bin/mypy"), *mine], cwd=ROOT).returncode == 0

        tests = ROOT / "tests/sites" / site
        before = pytest_run(tests)
        assert before.returncode == 0 and "3 skipped" in before.stdout, before.stdout
        assert "no recorded page yet: run ./control.sh parse" in before.stdout

        nourl = subprocess.run([str(ROOT / "control.sh"), "parse", f"{site}.pc.listing"], cwd=ROOT,
                               env=env, capture_output=True, text=True)  # fmt: skip
        assert nourl.returncode == 1 and f"has no base URL: set {env_name}" in nourl.stderr
        env[env_name] = pages.url
        for task, params in ((f"{site}.pc.listing", '{"page": 1}'),
                             (f"{site}.pc.thing", '{"id": "1-2"}'),
                             (f"{site}.app.things", '{"page": 1}')):  # fmt: skip
            rec = subprocess.run([str(ROOT / "control.sh"), "parse", task, params, "--save-fixture"],
                                 cwd=ROOT, env=env, capture_output=True, text=True)  # fmt: skip
            assert rec.returncode == 0, rec.stderr
            assert "recorded 1 answer(s) in tests/sites/" in rec.stderr
            assert "its parser test replays them" in rec.stderr
    finally:
        pages.stop()
    after = pytest_run(tests)  # the site is gone: the tests replay what was recorded
    assert after.returncode == 0 and "3 passed" in after.stdout, after.stdout + after.stderr
    with pytest.raises(UserError, match=r"exist.* already; not overwriting"):
        generate(site, "pc", "listing", kind="list")
    # a parser changed on purpose: its test names the command that records the page again
    module = ROOT / "sites" / site / "pc" / "thing.py"
    module.write_text(module.read_text().replace(".strip(), url=", ".strip().upper(), url="))
    changed = pytest_run(tests / "pc" / "test_thing.py")
    assert changed.returncode == 1 and "record it again: ./control.sh parse" in changed.stdout


@pytest.mark.parametrize("bad", ["Demo", "1site", "class", "a-b", ""])
def test_bad_names_are_refused(bad: str) -> None:
    with pytest.raises(UserError, match="lower-case Python name"):
        generate(bad, "pc", "x")


def test_bad_kind_url_and_a_site_without_base_url(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--kind 'page'"):
        generate("zzx", "pc", "x", tmp_path, kind="page")
    with pytest.raises(UserError, match="must be an http"):
        generate("zzx", "pc", "x", tmp_path, base_url="example.com")
    (tmp_path / "sites" / "zzx").mkdir(parents=True)
    (tmp_path / "sites" / "zzx" / "__init__.py").write_text('"""Mine."""\n')
    with pytest.raises(UserError, match="without a base_url"):
        generate("zzx", "pc", "x", tmp_path)
    assert sorted(p.name for p in (tmp_path / "sites" / "zzx").iterdir()) == ["__init__.py"]


def test_a_later_endpoint_of_the_site_is_told_the_base_url_written_first(tmp_path: Path) -> None:
    generate("zzy", "pc", "listing", tmp_path, base_url="http://127.0.0.1:9/")
    generate("zzy", "pc", "detail", tmp_path, kind="detail")  # no --base-url this time
    assert _written_base_url(tmp_path / "sites/zzy/__init__.py") == "http://127.0.0.1:9"
    assert _written_base_url(tmp_path / "sites/none/__init__.py") == ""


class BooksSite(ThreadedSite):
    """A book list whose rows are links (`a.book`), each book's page under `/book/{id}`."""

    def app(self) -> web.Application:
        async def books(req: web.Request) -> web.Response:
            rows = "".join(f'<div class="item" data-id="b{i}"><a href="/book/b{i}">Book {i}</a>'
                           "</div>" for i in range(2))  # fmt: skip
            return web.Response(text=f"<html><body>{rows}</body></html>", content_type="text/html")

        async def book(req: web.Request) -> web.Response:
            return web.Response(text=f"<html><h1>Book {req.match_info['id']}</h1></html>",
                                content_type="text/html")  # fmt: skip

        app = web.Application()
        app.router.add_get("/books", books)
        app.router.add_get("/book/{id}", book)
        return app


@pytest.mark.integration
def test_the_generated_tests_hold_after_a_real_edit_and_a_new_recording(
    site_name: str, redis_url: str, key_prefix: str
) -> None:
    """The list endpoint edited into one of link items (no title, a URL built from
    `base_url()`, not stored), the detail one's URL from `base_url()` too: recorded, the
    generated tests pass, after recording again too, and whatever base URL the shell that
    runs them has set."""
    site, env_name = site_name, f"CHAINCRAWL_BASE_URL_{site_name.upper()}"
    generate(site, "pc", "books", kind="list", item="book_link")
    generate(site, "pc", "book", kind="detail", item="book")
    pkg = ROOT / "sites" / site
    items_py = pkg / "items.py"
    fields = "    id: str\n    title: str\n    url: str\n"  # BookLink's, the first class
    link = "    store: ClassVar[bool] = False  # feeds the book step only\n\n    id: str\n    url: str\n"
    items_py.write_text(items_py.read_text().replace(fields, link, 1))
    assert "store: ClassVar[bool] = False" in items_py.read_text()
    books = pkg / "pc" / "books.py"
    text = books.read_text()
    start, end = text.index("        yield BookLink("), text.index('    if resp.css("a.next")')
    text = text.replace("from urllib.parse import urljoin\n\n", "")  # no longer used
    text = text.replace('        link = row.css("a")\n', "")
    start, end = text.index("        yield BookLink("), text.index('    if resp.css("a.next")')
    books.write_text(text[:start] + '''        book_id = row.attrib.get("data-id", "")
        yield BookLink(id=book_id, url=f"{base_url()}/book/{book_id}")
''' + text[end:])  # fmt: skip
    book = pkg / "pc" / "book.py"
    book.write_text(book.read_text().replace("url=resp.url", 'url=f"{base_url()}/book/{p.id}"'))
    ruff = str(ROOT / ".venv/bin/ruff")
    rel = [str(p.relative_to(ROOT)) for p in (books, book, items_py)]
    assert subprocess.run([ruff, "check", *rel], cwd=ROOT).returncode == 0

    pages = BooksSite().start()
    env = {**os.environ, "CHAINCRAWL_REDIS_URL": redis_url, "CHAINCRAWL_KEY_PREFIX": key_prefix,
           env_name: pages.url}  # fmt: skip
    tests = ROOT / "tests/sites" / site
    try:
        for _ in range(2):  # recorded, then recorded again: the tests hold both times
            for task, params in ((f"{site}.pc.books", '{"page": 1}'),
                                 (f"{site}.pc.book", '{"id": "b1"}')):  # fmt: skip
                rec = subprocess.run([str(ROOT / "control.sh"), "parse", task, params,
                                      "--save-fixture"], cwd=ROOT, env=env, capture_output=True,
                                     text=True)  # fmt: skip
                assert rec.returncode == 0, rec.stderr
            ran = pytest_run(tests)
            assert ran.returncode == 0 and "2 passed" in ran.stdout, ran.stdout + ran.stderr
    finally:
        pages.stop()
    recorded = (tests / "pc/fixtures/books/case.json").read_text()
    assert f"{pages.url}/book/b1" in recorded  # the field built from base_url(), as recorded
    elsewhere = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)], cwd=ROOT,
        capture_output=True, text=True, env={**os.environ, env_name: "http://mirror.example"},
    )  # fmt: skip
    assert elsewhere.returncode == 0 and "2 passed" in elsewhere.stdout, elsewhere.stdout


def test_the_next_steps_line_up_and_name_the_restart(
    site_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What to do next, one command a line with its note in one column; the last line says
    that workers already running need a restart to load the new endpoint."""
    assert run(site_name, "pc", "listing", base_url="http://127.0.0.1:9") == 0
    out = capsys.readouterr().out
    steps = out.split("next:\n", 1)[1].splitlines()
    noted = [line for line in steps if not line.rstrip().endswith(":") and "   " in line.strip()]
    assert len(noted) == 4, steps
    columns = {line.index(line.strip().split("   ")[-1].strip()) for line in noted}
    assert len(columns) == 1, steps  # every note starts in the same column
    assert steps[-1].split()[:2] == ["./control.sh", "restart"]
