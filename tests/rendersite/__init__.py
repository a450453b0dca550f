"""Endpoints that render any page of the demo platform, for the rendering integration tests:
what a page shows under a timeout, what the lent proxy, cookies and user agent look like to
the site, how a ban seen in a rendered page retires a session. Loaded by test workers through
CHAINCRAWL_EXTRA_SITE_PACKAGES=tests.testsite,tests.rendersite; site `rendersite`, whose
sessions are judged by the demo's login wall (`id="login-wall"`)."""

from __future__ import annotations

from exceptions import LoginRequired
from external_interface.resources.rules import Verdict, add_rules, rule

add_rules(
    "rendersite",
    "cookie",
    rule(Verdict.BANNED, {200}, ['id="login-wall"'], LoginRequired, "login wall page"),
)
