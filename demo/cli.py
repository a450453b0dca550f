"""Command line: one `--flag` per `DemoConfig` field, plus --config, --print-config, --expected."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from demo.config import FEATURES, SIZE_PRESETS, DemoConfig


def _metavar(annotation: object) -> str:
    if annotation is int:
        return "N"
    if annotation is float:
        return "X"
    if annotation is str:
        return "TEXT"
    return "LIST" if "tuple" in str(annotation) or "frozenset" in str(annotation) else "VALUE"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="DemoNews: a local social news platform (pc HTML, h5 and app JSON APIs) "
        "with switchable anti-crawl behaviour. Full reference: demo/README.md.",
    )
    parser.add_argument("--config", help="JSON or YAML file of settings (flags override it)")
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective config as JSON and exit"
    )
    parser.add_argument(
        "--expected", action="store_true", help="print expected_counts() as JSON and exit"
    )
    group = parser.add_argument_group("settings (DemoConfig fields; also env DEMO_<FIELD>)")
    for name, field in DemoConfig.model_fields.items():
        help_text = field.description or ""
        if name == "features":
            help_text = f"comma list of {','.join(FEATURES)} (or all/none)"
        elif name == "size":
            help_text = ", ".join(f"{k}={u}x{p}x{c}" for k, (u, p, c) in SIZE_PRESETS.items())
        default = field.get_default(call_default_factory=True)
        if isinstance(default, frozenset | tuple):
            default = ",".join(
                map(str, sorted(default) if isinstance(default, frozenset) else default)
            )
        elif isinstance(default, dict):
            default = "demo1..demo20 with pass-demo<N>" if name == "accounts" else default
        extra: dict[str, object] = {"metavar": _metavar(field.annotation)}
        if field.annotation is bool:
            extra = {"nargs": "?", "const": "true", "metavar": "BOOL"}
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            help=f"{help_text} (default: {default})".strip(),
            **extra,  # type: ignore[arg-type]
        )
    return parser


def config_from_args(argv: Sequence[str] | None = None) -> tuple[DemoConfig, argparse.Namespace]:
    args = build_parser().parse_args(argv)
    overrides = {name: getattr(args, name) for name in DemoConfig.model_fields}
    return DemoConfig.load(args.config, **overrides), args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config, args = config_from_args(argv)
    except (ValidationError, ValueError, OSError) as e:
        print(f"demo: bad configuration: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(config.model_dump(mode="json"), indent=2, ensure_ascii=False))
        return 0
    if args.expected:
        print(json.dumps(config.expected_counts(), indent=2))
        return 0
    from demo.server import run

    run(config)
    return 0
