"""`DemoConfig`: every knob of the demo platform, from a file, `DEMO_*` variables or CLI flags.

Precedence (highest first): explicit arguments (CLI flags), the `--config` file, `DEMO_<FIELD>`
environment variables, defaults. `size` only fills the counts that were not given explicitly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_serializer, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from demo import changes, data

FEATURES = ("rate_limit", "ua_check", "sign", "device", "login", "soft_fail")
SOFT_FAIL_KINDS = ("slow", "error", "truncate")

# name: (users, posts_per_user, comments_per_post)
SIZE_PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (5, 3, 4),
    "small": (20, 5, 5),
    "medium": (200, 10, 5),
    "large": (1000, 10, 10),
    "huge": (10000, 10, 10),
}


def default_accounts() -> dict[str, str]:
    return {f"demo{i}": f"pass-demo{i}" for i in range(1, 21)}


def _split(value: Any) -> Any:
    """Accept "a,b" (CLI, env) as well as real lists."""
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            return json.loads(value)
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class DemoConfig(BaseSettings):
    """Settings of one demo server; the README's configuration table mirrors this class."""

    model_config = SettingsConfigDict(env_prefix="DEMO_", extra="ignore")

    # --- network --------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(8700, ge=0, le=65535)
    backlog: int = Field(4096, ge=1, description="listen() backlog for bursts of connections")
    access_log: bool = False
    use_uvloop: bool = Field(True, description="use uvloop when it is installed")

    # --- data -----------------------------------------------------------------------------
    seed: int = 42
    size: str = Field(
        "small", description="preset filling users/posts/comments: " + "/".join(SIZE_PRESETS)
    )
    users: int = Field(ge=0, default=20)
    posts_per_user: int = Field(ge=1, default=5)
    comments_per_post: int = Field(ge=0, default=5)

    # --- paging ---------------------------------------------------------------------------
    pc_feed_page_size: int = Field(data.PC_FEED_PAGE_SIZE, ge=1)
    pc_user_page_size: int = Field(data.PC_USER_PAGE_SIZE, ge=1)
    pc_comments_page_size: int = Field(data.PC_COMMENTS_PAGE_SIZE, ge=1)
    h5_feed_page_size: int = Field(data.H5_FEED_PAGE_SIZE, ge=1)
    h5_statuses_page_size: int = Field(data.H5_STATUSES_PAGE_SIZE, ge=1)
    h5_comments_page_size: int = Field(data.H5_COMMENTS_PAGE_SIZE, ge=1)
    app_default_size: int = Field(data.APP_DEFAULT_SIZE, ge=1)
    app_max_size: int = Field(data.APP_MAX_SIZE, ge=1)
    proxies_page_size: int = Field(20, ge=1)
    js_feed_page_size: int = Field(data.JS_FEED_PAGE_SIZE, ge=1)
    js_batch_size: int = Field(
        data.JS_BATCH_SIZE, ge=1, description="feed entries per load-more click / scroll batch"
    )

    # --- latency --------------------------------------------------------------------------
    latency_ms: float = Field(0.0, ge=0)
    latency_jitter_ms: float = Field(0.0, ge=0, description="uniform extra 0..jitter per response")

    # --- anti-crawl -----------------------------------------------------------------------
    features: Annotated[frozenset[str], NoDecode] = frozenset()

    rate_limit_requests: int = Field(20, ge=1, description="allowed requests per window per IP")
    rate_limit_window_s: float = Field(1.0, gt=0)
    rate_limit_ban_after: int = Field(5, ge=0, description="429s within the strike window; 0=never")
    rate_limit_strike_window_s: float = Field(60.0, gt=0)
    rate_limit_ban_s: float = Field(30.0, ge=0)

    sign_key: str = "demo-sign-key"
    sign_skew_s: float = Field(300.0, ge=0)

    device_ban_rpm: int = Field(0, ge=0, description="ban a device above this many req/min; 0=off")

    accounts: Annotated[dict[str, str], NoDecode] = Field(default_factory=default_accounts)
    captcha_length: int = Field(4, ge=1, le=12)
    captcha_ttl_s: float = Field(300.0, gt=0)
    session_ban_rpm: int = Field(0, ge=0, description="ban a session above this many uses/min")

    soft_fail_rate: float = Field(0.0, ge=0, le=1)
    soft_fail_kinds: Annotated[tuple[str, ...], NoDecode] = SOFT_FAIL_KINDS
    soft_fail_statuses: Annotated[tuple[int, ...], NoDecode] = (500, 502, 503)
    soft_fail_slow_ms: float = Field(2000.0, ge=0)
    soft_fail_seed: int | None = Field(None, description="RNG seed for soft failures; None=seed")

    # --- the mix front and the guarded front ----------------------------------------------
    mix_rendered: Annotated[tuple[str, ...], NoDecode] = Field(
        ("post",), description="mix page types (feed, post) filled by script; the rest static"
    )
    guard_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve the platform over TLS + HTTP/2 behind a browser check on this "
        "port (0: a free one); unset: no guarded front",
    )
    guard_cert: str | None = Field(None, description="the guarded front's certificate (PEM)")
    guard_key: str | None = Field(
        None,
        description="its private key; unset with the cert: "
        "a CA and a certificate are made at start",
    )
    # --- changes (demo/changes.py) ---------------------------------------------------------
    changes: bool = Field(False, description="posts' likes change over (simulated) time")
    change_classes: str = Field(
        "0.03:8/d, 0.07:2/d, 0.9:1/30d",
        description="share:rate of the posts' change classes (shares add up to 1)",
    )
    change_hours: str = Field("8-11,19-22", description="UTC hours in which posts change most")
    change_quiet: float = Field(
        0.05, ge=0, le=1, description="intensity of the other hours, relative to the busy ones"
    )
    change_start: float = Field(
        data.BASE_TS,
        description="simulated time (unix s) at which changes begin and the clock starts",
    )
    change_clock: str = Field("wall", description="wall (runs by itself) or manual (/admin/clock)")
    change_clock_speed: float = Field(
        1.0, gt=0, description="simulated seconds per second of a wall clock"
    )

    # --- misc -----------------------------------------------------------------------------
    proxies: Annotated[tuple[str, ...], NoDecode] = ()
    proxies_file: str | None = Field(None, description="one proxy per line, re-read per request")
    stats_window_s: float = Field(60.0, gt=0, description="how long request timestamps are kept")

    # --- validation -----------------------------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _apply_size(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        size = values.get("size", "small")
        if size not in SIZE_PRESETS:
            raise ValueError(f"unknown size {size!r}; choose from {', '.join(SIZE_PRESETS)}")
        for name, preset in zip(
            ("users", "posts_per_user", "comments_per_post"), SIZE_PRESETS[size], strict=True
        ):
            if values.get(name) is None:
                values[name] = preset
        return values

    @field_validator("features", mode="before")
    @classmethod
    def _features(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip() in ("all", "none"):
            return FEATURES if value.strip() == "all" else []
        value = _split(value)
        unknown = set(value or ()) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}; known: {', '.join(FEATURES)}")
        return value

    @field_validator("soft_fail_kinds", mode="before")
    @classmethod
    def _kinds(cls, value: Any) -> Any:
        value = _split(value)
        unknown = set(value or ()) - set(SOFT_FAIL_KINDS)
        if unknown or not value:
            raise ValueError(f"soft_fail_kinds must be a non-empty subset of {SOFT_FAIL_KINDS}")
        return value

    @field_validator("mix_rendered", mode="before")
    @classmethod
    def _mix(cls, value: Any) -> Any:
        value = _split(value)
        unknown = set(value or ()) - {"feed", "post"}
        if unknown:
            raise ValueError(f"unknown mix page types {sorted(unknown)}; known: feed, post")
        return value

    @field_validator("change_classes")
    @classmethod
    def _classes(cls, value: str) -> str:
        changes.parse_classes(value)
        return value

    @field_validator("change_hours")
    @classmethod
    def _hours(cls, value: str) -> str:
        changes.parse_hours(value)
        return value

    @field_validator("change_clock")
    @classmethod
    def _clock(cls, value: str) -> str:
        if value not in ("wall", "manual"):
            raise ValueError("change_clock must be wall or manual")
        return value

    @field_validator("soft_fail_statuses", "proxies", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split(value)

    @field_validator("accounts", mode="before")
    @classmethod
    def _accounts(cls, value: Any) -> Any:
        """Also "user:pass,user2:pass2" (CLI, env)."""
        if isinstance(value, str):
            if value.strip().startswith("{"):
                return json.loads(value)
            return dict(part.split(":", 1) for part in _split(value))
        return value

    @field_serializer("features")
    def _dump_features(self, value: frozenset[str]) -> list[str]:
        return sorted(value)

    # --- helpers --------------------------------------------------------------------------
    def enabled(self, feature: str) -> bool:
        return feature in self.features

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides: Any) -> DemoConfig:
        """File values (JSON or YAML) under `overrides`; unknown keys are an error, not ignored."""
        values: dict[str, Any] = {}
        if path is not None:
            values.update(read_config_file(path))
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - set(cls.model_fields)
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(sorted(unknown))}")
        return cls(**values)

    def expected_counts(self, app_page_size: int | None = None) -> dict[str, object]:
        """`data.expected_counts` with this server's sizes and page sizes."""
        return data.expected_counts(
            self.users,
            self.posts_per_user,
            self.comments_per_post,
            pc_feed_page_size=self.pc_feed_page_size,
            pc_user_page_size=self.pc_user_page_size,
            pc_comments_page_size=self.pc_comments_page_size,
            h5_feed_page_size=self.h5_feed_page_size,
            h5_statuses_page_size=self.h5_statuses_page_size,
            h5_comments_page_size=self.h5_comments_page_size,
            app_page_size=app_page_size or self.app_default_size,
            app_max_size=self.app_max_size,
            js_feed_page_size=self.js_feed_page_size,
            js_batch_size=self.js_batch_size,
        )


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A JSON or YAML mapping (chosen by suffix; YAML for anything but .json)."""
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith(".json"):
        loaded = json.loads(text)
    else:
        import yaml

        loaded = yaml.safe_load(text) or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping of settings")
    return loaded
