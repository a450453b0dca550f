"""What the demo platform expects of a client, written from demo/README.md section 8:
user agents per front end, the app signature, device and session bans, login accounts.

Registered at import into the generic registries (signers, UA sets, ban rules, pool defaults,
accounts); nothing here talks to the site.
"""

from __future__ import annotations

from base_task import Verdict, add_rules, rule
from exceptions import BannedError, LoginRequired
from external_interface.resources import accounts, user_agent
from external_interface.resources.pool import configure_pool
from external_interface.resources.sign import HmacQuerySigner, sign_key, signers

SITE = "demo"
DEFAULT_SIGN_KEY = "demo-sign-key"  # the demo's documented default (`sign_key` setting)
DEVICE_HEADER = "X-Device-Id"

# (model, os) of the devices we register; the UA is derived from them and stays with the device
DEVICE_PROFILES: tuple[tuple[str, str], ...] = (
    ("Pixel 8", "Android 14"),
    ("Pixel 7", "Android 13"),
    ("SM-S911B", "Android 14"),
    ("Mi 13", "Android 13"),
    ("iPhone15,2", "iOS 17.4"),
    ("iPhone14,5", "iOS 16.6"),
)
APP_VERSIONS: tuple[str, ...] = ("3.2.1", "3.3.0", "4.0.2")


def app_user_agent(model: str, os_name: str, version: str) -> str:
    """The app's UA format: `DemoApp/<version> (<os>; <model>)` (must match DemoApp/\\d+(\\.\\d+)*)."""
    return f"DemoApp/{version} ({os_name}; {model})"


def default_accounts() -> dict[str, str]:
    """The demo's documented test accounts, used only when no configuration names others."""
    return {f"demo{i}": f"pass-demo{i}" for i in range(1, 21)}


# --- registrations ------------------------------------------------------------------------

signers.add(SITE, lambda site: HmacQuerySigner(sign_key(site, DEFAULT_SIGN_KEY)))

user_agent.register(
    SITE, "app", [app_user_agent(m, o, v) for m, o in DEVICE_PROFILES for v in APP_VERSIONS]
)

accounts.register_defaults(SITE, default_accounts)

# Sessions: the comment endpoints answer the login wall (h5/app 401 JSON, pc a 200 page) for a
# missing, unknown or banned session. Every 403 of the demo is about something else (IP ban,
# user agent, sign, device), so it says nothing about the session.
add_rules(
    SITE,
    "cookie",
    rule(Verdict.BANNED, {401}, ['"login_required"'], LoginRequired, "login wall"),
    rule(
        Verdict.BANNED,
        {200},
        ['class="page-login"', 'id="login-wall"'],
        LoginRequired,
        "login wall page",
    ),
    rule(Verdict.NEUTRAL, {401, 403}),
)
# Devices: banned for good above device_ban_rpm, unknown after a server restart; other 403s
# (IP ban, bad sign, bad UA) and the login wall are not the device's fault.
add_rules(
    SITE,
    "device_id",
    rule(Verdict.BANNED, {403}, ['"device_banned"'], BannedError, "device banned"),
    rule(Verdict.BANNED, {403}, ['"unknown_device"'], BannedError, "unknown device"),
    rule(Verdict.NEUTRAL, {401, 403}),
)

# Proxies: only the rate limit is about the client address (429 `rate_limited`, then 403
# `banned` with Retry-After); every other 401/403 blames a session, device, UA or signature.
add_rules(
    SITE,
    "proxy",
    rule(Verdict.BANNED, {429}, reason="rate limited"),
    rule(Verdict.BANNED, {403}, ['"banned"', "error-banned"], reason="IP banned"),
    rule(Verdict.NEUTRAL, {401, 403}),
)

# Leases are exclusive, so `target` bounds how many comment (cookie) or app (device) requests
# run at once; producing either costs the demo a few cheap requests.
configure_pool("cookie", SITE, low_water=6, target=16, lease_ttl=60)
# The demo allows 20 requests a second per client address: a proxy rests 1/20 s after each
configure_pool("proxy", SITE, cooldown=0.05)
configure_pool("device_id", SITE, low_water=6, target=16, lease_ttl=60)
