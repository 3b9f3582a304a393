"""Command line: `python -m infra <command>`.

    render --stack STACK --out DIR    write what STACK would deploy (no CLI, cluster or Docker)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infra.config import ConfigError


def _render(args: argparse.Namespace) -> int:
    from infra import render

    rendered = render.render(args.stack)
    render.write(rendered, Path(args.out))
    manifests = rendered.manifests()
    print(
        f"rendered stack {args.stack}: {len(rendered.registrations)} resources, "
        f"{len(manifests)} Kubernetes objects -> {args.out}"
    )
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m infra", description=__doc__.splitlines()[0])
    commands = root.add_subparsers(dest="command", required=True)

    render = commands.add_parser("render", help="render a stack's Kubernetes objects and resources offline")
    render.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    render.add_argument("--out", required=True, help="output directory")
    render.set_defaults(run=_render)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
