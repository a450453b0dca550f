"""The demo's cookie production chain (demo/README.md 8.5), on the `resources` queue:

    demo.captcha.download -> demo.captcha.recognize -> demo.login -> demo.cookie.add

The login step picks an account from configuration, posts the form, and puts the session
cookie into the vault; only the vault ticket travels on to `demo.cookie.add`, which moves it
into the pool. A captcha is single use, so a rejected answer makes the login step fetch and
solve a fresh one itself (each rejection is counted).
"""

from __future__ import annotations

from http.cookies import CookieError, SimpleCookie
from typing import Any, ClassVar

import chains
from base_task import Context, Item, Outputs, Params, endpoint
from exceptions import CrawlError, ParseError, Policy, error_for_status
from external_interface.fetch import Response
from external_interface.resources import vault
from external_interface.resources.accounts import Accounts
from external_interface.resources.captcha import CaptchaStats, Challenge, solve, verdict
from external_interface.resources.pool import Pool, register_producer
from sites.demo import base_url
from sites.demo.production.profile import SITE
from sites.production import (
    QUEUE,
    PoolEntry,
    ProduceParams,
    Ticket,
    TicketParams,
    chain_producer,
)

LOGIN_ATTEMPTS = 4


class LoginFailed(CrawlError):
    """No session after several captchas/accounts; the task retries later."""

    policy = Policy.RETRY


class CaptchaChallenge(Item):
    item_type: ClassVar[str] = "demo.captcha.challenge"
    key_fields: ClassVar[tuple[str, ...]] = ("captcha_id",)
    store: ClassVar[bool] = False
    captcha_id: str
    format: str
    image: str
    length: int


class RecognizeParams(Params):
    captcha_id: str
    format: str = "ascii-5x7"
    image: str
    length: int = 0


class CaptchaSolution(Item):
    item_type: ClassVar[str] = "demo.captcha.solution"
    key_fields: ClassVar[tuple[str, ...]] = ("captcha_id",)
    store: ClassVar[bool] = False
    captcha_id: str
    answer: str  # "" when recognition failed: the login step then fetches a fresh captcha


class LoginParams(Params):
    captcha_id: str
    answer: str = ""


def fetch_challenge(ctx: Context) -> CaptchaChallenge:
    data = ctx.get(f"{base_url()}/login/captcha").json()
    try:
        return CaptchaChallenge(
            captcha_id=data["captcha_id"],
            format=data.get("format", "ascii-5x7"),
            image=data["image"],
            length=int(data.get("length") or 0),
        )
    except (KeyError, TypeError, ValueError):
        raise ParseError("captcha answer lacks captcha_id/image") from None


def recognize(ch: CaptchaChallenge | RecognizeParams, stats: CaptchaStats | None = None) -> str:
    return solve(Challenge(ch.image, ch.format, ch.length or None), SITE, stats=stats) or ""


@endpoint(
    ProduceParams,
    items=[CaptchaChallenge],
    name="demo.captcha.download",
    queue=QUEUE,
    resources=["user_agent"],
)
def captcha_download(ctx: Context, p: ProduceParams) -> Outputs:
    """A fresh login captcha."""
    yield fetch_challenge(ctx)


@endpoint(RecognizeParams, items=[CaptchaSolution], name="demo.captcha.recognize", queue=QUEUE)
def captcha_recognize(ctx: Context, p: RecognizeParams) -> Outputs:
    """The site's recognizer (external_interface.resources.captcha); failures are counted there."""
    yield CaptchaSolution(captcha_id=p.captcha_id, answer=recognize(p))


@endpoint(LoginParams, items=[Ticket], name="demo.login", queue=QUEUE, resources=["user_agent"])
def login(ctx: Context, p: LoginParams) -> Outputs:
    """Log in with a configured account; the session goes to the vault, its ticket on."""
    accounts = Accounts(SITE)
    stats = CaptchaStats(SITE)
    captcha_id, answer = p.captcha_id, p.answer
    for _ in range(LOGIN_ATTEMPTS):
        if not answer:
            ch = fetch_challenge(ctx)
            captcha_id, answer = ch.captcha_id, recognize(ch, stats)
            if not answer:
                continue
        account = accounts.pick()
        form = {
            "username": account.username,
            "password": account.password,
            "captcha_id": captcha_id,
            "captcha_answer": answer,
        }
        resp = ctx.post(f"{base_url()}/login", data=form, ok_statuses=(403,))
        if resp.status == 200:
            verdict(SITE, True, stats)
            cookies = session_cookies(resp)
            if "session" not in cookies:
                raise ParseError("login answered 200 without a session cookie")
            ticket = vault.put("cookie", SITE, {"cookies": cookies, "account": account.username})
            ctx.log.info("logged in as %s; the session waits in the vault", account)
            yield Ticket(ticket=ticket)
            return
        code = error_code(resp)
        if code == "bad_captcha":
            verdict(SITE, False, stats)
            ctx.count("captcha_rejected")
        elif code == "bad_credentials":
            accounts.disable(account)
            ctx.count("login_refused")
            ctx.log.warning("account %s refused by the site; skipped for a while", account)
        else:
            raise error_for_status(resp.status, resp.url)  # e.g. an IP ban: retry later
        answer = ""  # the captcha was consumed either way
    raise LoginFailed(f"no demo session after {LOGIN_ATTEMPTS} attempts")


@endpoint(TicketParams, items=[PoolEntry], name="demo.cookie.add", queue=QUEUE)
def cookie_add(ctx: Context, p: TicketParams) -> Outputs:
    """Move the session from the vault into the cookie pool."""
    pool = Pool("cookie", SITE)
    yield PoolEntry(pool=pool.name, member=vault.into_pool(pool, p.ticket))


# --- helpers ------------------------------------------------------------------------------


def session_cookies(resp: Response) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(resp.headers.get("set-cookie", ""))
    except CookieError:
        raise ParseError("unreadable Set-Cookie on the login answer") from None
    return {name: morsel.value for name, morsel in jar.items()}


def error_code(resp: Response) -> str:
    try:
        data: Any = resp.json()
    except ParseError:
        return ""
    return str(data.get("error", "")) if isinstance(data, dict) else ""


# --- the chain ----------------------------------------------------------------------------

_Q = {"queue": QUEUE}

COOKIE_CHAIN = chains.define(
    "demo_cookie_production",
    chains.step("demo.captcha.download", _options=_Q).then(
        chains.step(
            "demo.captcha.recognize",
            captcha_id="captcha_id",
            image="image",
            format="format",
            length="length",
            _options=_Q,
        ).then(
            chains.step("demo.login", captcha_id="captcha_id", answer="answer", _options=_Q).then(
                chains.step("demo.cookie.add", ticket="ticket", _options=_Q)
            )
        )
    ),
)

register_producer("cookie", SITE, chain_producer(COOKIE_CHAIN))
