"""Who chaincrawl says it is: one honest User-Agent, `chaincrawl/VERSION (+URL)`, sent by
every request no user agent was lent to or set on (every fetcher: urllib3, requests, the
impersonating one; robots.txt and sitemap fetches), and whose product token `chaincrawl` is
the one robots.txt groups are matched against. User-agent rotation stays opt-in
(`resources=["user_agent"]`).

URL: where a site's owner reads who crawls them and how to reach the operator:
`CHAINCRAWL_CONTACT_URL_<SITE>`, else `CHAINCRAWL_CONTACT_URL`, else the project's page.
"""

from __future__ import annotations

from collections.abc import Mapping

from config import site_env

VERSION = "0.1.0"  # pyproject.toml's [project] version
PRODUCT = (
    "chaincrawl"  # the token robots.txt `User-agent:` lines name (CHAINCRAWL_ROBOTS_USER_AGENT)
)
DEFAULT_CONTACT = "https://github.com/chaincrawl/chaincrawl"


def default_user_agent(site: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """`chaincrawl/VERSION (+URL)`, the URL the site's (or every site's) contact URL."""
    url = site_env("contact_url", site or "", environ) or DEFAULT_CONTACT
    return f"{PRODUCT}/{VERSION} (+{url})"


def has_user_agent(headers: Mapping[str, str] | None) -> bool:
    return any(k.lower() == "user-agent" for k in headers or {})
