"""`control.sh parse TASK ['PARAMS']`: one endpoint, once, live, outside the broker.

Prints what the endpoint yields as JSON lines on stdout, one object a line:

    {"kind": "item", "type": "demo.post", "item": {...}}
    {"kind": "follow", "params": {...}}                          the same step, next page
    {"kind": "child", "step": "...", "task": "...", "params": {...}}   with --chain

and on stderr, as they come, the endpoint's `ctx.log` lines (INFO and up), the requests it
makes and the pages it renders (`RENDER url -> status`, with what each action did and the
answers captured), then a summary. Nothing is stored, nothing is sent to a broker. With `CHAINCRAWL_HTTP_CACHE` set, a second run answers from disk. `--save-fixture`
records the answers for the endpoint's parser test (external_interface/fetch/mock.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

import chains
import sites
from cli import UserError, procs
from config import ROOT, SITE_VARS, get_settings
from exceptions import ChainCrawlError, RobotsUnavailable
from external_interface.browser import RenderedPage
from external_interface.fetch import FetchRequest, Response
from external_interface.fetch.mock import fixture_dir, outputs_of, save_case
from ledger.model import Chain
from lifecycle.endpoints import EndpointSpec
from lifecycle.live import LiveResult, run_live
from utils.registry import UnknownNameError


def params_arg(text: str | None) -> dict[str, Any]:
    """The PARAMS argument: a JSON object (none: `{}`)."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"PARAMS is not valid JSON ({exc.msg} at column {exc.colno}): {text!r}"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"PARAMS must be a JSON object, e.g. '{{\"page\": 1}}', got {text!r}")
    return data


def endpoint(task: str) -> EndpointSpec:
    try:
        return sites.get_endpoint(task)
    except UnknownNameError as exc:
        raise UserError(str(exc)) from None


def chain_step(chain_name: str, task: str, step: str | None) -> tuple[Chain, str]:
    """The chain, and the step of it that runs `task` (named, or the only one)."""
    try:
        chain = chains.get_chain(chain_name)
    except ChainCrawlError as exc:
        raise UserError(str(exc)) from None
    if step:
        node = chain.steps.get(step)
        if node is None:
            raise UserError(
                f"chain {chain_name} has no step {step!r} (steps: {', '.join(chain.steps)})"
            )
        if node.task != task:
            raise UserError(f"step {step!r} of chain {chain_name} runs {node.task}, not {task}")
        return chain, step
    mine = [sid for sid, node in chain.steps.items() if node.task == task]
    if len(mine) != 1:
        which = f"steps {', '.join(mine)} run it" if mine else "no step runs it"
        raise UserError(f"chain {chain_name}: {which}; name one with --step")
    return chain, mine[0]


def lines(result: LiveResult) -> Iterator[dict[str, Any]]:
    for it in result.items:
        yield {"kind": "item", "type": it.item_type, "item": it.model_dump(mode="json")}
    for f in result.follows:
        yield {"kind": "follow", "params": f.params}
    for kid in result.children:
        yield {"kind": "child", "step": kid.step, "task": kid.task, "params": kid.params}


def run(
    task: str,
    params: dict[str, Any],
    *,
    chain: str | None = None,
    step: str | None = None,
    save_fixture: bool = False,
    fixtures: str | None = None,
) -> int:
    """The command; -> exit status (1 when the endpoint failed)."""
    spec = endpoint(task)
    chain_obj, step_id = chain_step(chain, task, step) if chain else (None, "")
    if procs.ensure_redis(get_settings()) == "started":  # providers and the gate live in Redis
        print("redis: started the embedded Redis", file=sys.stderr)
    started = time.monotonic()
    with endpoint_log(spec.name):  # each request as it is answered, among the endpoint's log
        result = run_live(
            spec, params, chain=chain_obj, step=step_id, on_exchange=said, on_render=rendered
        )
    took = time.monotonic() - started
    if result.error is not None:
        return _failed(result, save_fixture)
    try:
        for line in lines(result):
            sys.stdout.buffer.write(orjson.dumps(line, option=orjson.OPT_NON_STR_KEYS) + b"\n")
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    from_cache = sum(1 for _, resp in result.exchanges if resp.from_cache)
    types = sorted({it.item_type for it in result.items})
    print(
        f"{task}: {len(result.items)} item(s)"
        + (f" ({', '.join(types)})" if types else "")
        + f", {len(result.follows)} follow-up(s)"
        + (f", {len(result.children)} child task(s) of step {step_id}" if chain_obj else "")
        + f"; {len(result.exchanges) + len(result.renders)} request(s)"
        + (f" ({len(result.renders)} rendered)" if result.renders else "")
        + f", {from_cache} from the HTTP cache, {took:.2f}s;"
        " nothing stored",
        file=sys.stderr,
    )
    if result.dropped:
        why = ", ".join(f"{reason} {n}" for reason, n in sorted(result.dropped.items()))
        print(f"dropped by before_store hooks: {why}", file=sys.stderr)
    if not result.items and not result.dropped and spec.item_types and result.exchanges:
        url = result.exchanges[-1][1].url
        print(
            f"note: no item from a page that answered: do the selectors match it? Try them on "
            f"the page as the endpoint gets it: ./control.sh shell {shlex.quote(url)} --task {task}",
            file=sys.stderr,
        )
    if save_fixture:
        _save(result, fixtures)
    return 0


def said(exchange: tuple[FetchRequest, Response]) -> None:
    """A request's line, `GET URL -> 200`, printed when its answer came."""
    req, resp = exchange
    cached = " (from the HTTP cache)" if resp.from_cache else ""
    print(f"{req.method} {resp.url} -> {resp.status}{cached}", file=sys.stderr)


def rendered(page: RenderedPage) -> None:
    print(render_line(page.url, page.status, page.steps, len(page.captured)), file=sys.stderr)


@contextmanager
def endpoint_log(task: str) -> Iterator[None]:
    """The endpoint's `ctx.log` (logger `chaincrawl.site.<task>`) on stderr from INFO up, as
    `log: LEVEL message`, while it runs: what a developer reads next to its output."""
    logger = logging.getLogger(f"chaincrawl.site.{task}")
    out = logging.StreamHandler(sys.stderr)
    out.setFormatter(logging.Formatter("log: %(levelname)s %(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(out)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # said once, not again by a root handler
    try:
        yield
    finally:
        logger.removeHandler(out)
        logger.setLevel(level)
        logger.propagate = propagate


def render_line(url: str, status: int, steps: Sequence[Mapping[str, Any]], captured: int) -> str:
    """One rendered page as parse shows it: `RENDER url -> status` and what its actions did."""
    done = []
    for st in steps:
        facts = ", ".join(f"{k} {v}" for k, v in st.items() if k != "action")
        done.append(f"{st.get('action', '?')}" + (f" ({facts})" if facts else ""))
    extra = [f"{captured} answer(s) captured"] if captured else []
    extra += [f"actions: {'; '.join(done)}"] if done else []
    return f"RENDER {url} -> {status}" + (f" [{'; '.join(extra)}]" if extra else "")


def _failed(result: LiveResult, save_fixture: bool) -> int:
    exc = result.error
    assert exc is not None
    if isinstance(exc, ChainCrawlError):  # the machinery's typed errors say what happened
        print(f"error: {result.spec.name} raised {type(exc).__name__}: {exc}", file=sys.stderr)
        if isinstance(exc, RobotsUnavailable):
            print(robots_hint(result.spec.site), file=sys.stderr)
    else:  # a bug in the endpoint's own code: its traceback is what the developer needs
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    if save_fixture:
        print("nothing recorded: the endpoint failed", file=sys.stderr)
    return 1


def robots_hint(site: str) -> str:
    """What to do about a robots.txt that could not be read: most often, in development, a
    site that was not up (or not at that address) when it was first asked for."""
    s = get_settings()
    return (
        "hint: no request goes to a site whose robots.txt could not be read (nothing answered, "
        "a 5xx or a 429): is the site up at that address? Every process keeps the failure: "
        f"no answer for CHAINCRAWL_ROBOTS_UNREACHABLE_TTL ({s.robots_unreachable_ttl:g}s, "
        "doubled with each failure in a row), a 5xx or 429 for CHAINCRAWL_ROBOTS_ERROR_TTL "
        f"({s.robots_error_ttl:g}s), even once the site answers; "
        f"CHAINCRAWL_ROBOTS_IGNORE={site} skips robots.txt for the site"
    )


def _save(result: LiveResult, fixtures: str | None) -> None:
    folder = Path(fixtures) if fixtures else fixture_dir(result.spec.name, ROOT / "tests")
    base = SITE_VARS["base_url"].name(result.spec.site)  # replayed as recorded
    files = save_case(
        folder,
        result.spec.name,
        result.params,
        result.exchanges,
        outputs_of(result.items, result.follows),
        env={base: os.environ.get(base) or None},
    )
    shown = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
    print(
        f"recorded {len(result.exchanges)} answer(s) in {shown}/ "
        f"({', '.join(f.name for f in files)})",
        file=sys.stderr,
    )
    test = folder.parent.parent / f"test_{folder.name}.py"
    if test.exists():
        print(
            f"its parser test replays them: ./control.sh test {test.relative_to(ROOT)}",
            file=sys.stderr,
        )


def main(a: argparse.Namespace) -> int:
    return run(
        a.task,
        params_arg(a.params),
        chain=a.chain,
        step=a.step,
        save_fixture=a.save_fixture,
        fixtures=a.fixture_dir,
    )
