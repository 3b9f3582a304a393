"""The project's local state backend: `.pulumi-state/` beside Pulumi.yaml, which `scripts/up.sh`
creates, with a generated passphrase for the stacks' secrets in `.pulumi-state/passphrase`.

One rule, used by `scripts/up.sh`, `scripts/env.sh` and every `python -m infra` command (cloudstation_tools/cli.py):
when PULUMI_BACKEND_URL is unset (and Pulumi.yaml names no `backend.url`) and `.pulumi-state/`
exists, the backend is `file://<repo>/.pulumi-state`; when that local backend is the one in use and
no passphrase is set, the passphrase is `.pulumi-state/passphrase`. A passphrase is never pointed at
another backend's stacks.

    python -m cloudstation_tools.local_backend [--create]     print `export NAME=value` lines for a shell's eval
"""
from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shlex
import sys
from pathlib import Path
from typing import Iterator, Mapping, MutableMapping, Optional
from urllib.parse import unquote, urlsplit

import yaml

ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = ".pulumi-state"
PASSPHRASE_FILE = "passphrase"


def state_dir(root: Path) -> Path:
    return Path(root).resolve() / STATE_DIR


def local_url(root: Path) -> str:
    return f"file://{state_dir(root)}"


def _project_backend(root: Path) -> Optional[str]:
    try:
        project = yaml.safe_load((Path(root) / "Pulumi.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None
    return ((project.get("backend") or {}) if isinstance(project, dict) else {}).get("url") or None


def _is_local(url: str, root: Path) -> bool:
    parts = urlsplit(url)
    if parts.scheme != "file":
        return False
    path = Path(unquote(parts.netloc + parts.path)) if parts.netloc not in ("", "localhost") else Path(unquote(parts.path))
    return path.resolve() == state_dir(root)


def _passphrase_set(env: Mapping[str, str]) -> bool:
    # As the CLI reads them (pulumi/pulumi pkg/secrets/passphrase/manager.go, `readPassphrase`):
    # PULUMI_CONFIG_PASSPHRASE counts when present, even empty (os.LookupEnv); the _FILE variable
    # only when non-empty.
    return "PULUMI_CONFIG_PASSPHRASE" in env or bool(env.get("PULUMI_CONFIG_PASSPHRASE_FILE"))


def defaults(root: Path = ROOT, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables to add to `env` so Pulumi (and promote's state reads) find the backend and
    passphrase `scripts/up.sh` used; empty when the user chose their own or there is no local state."""
    state = state_dir(root)
    additions: dict[str, str] = {}
    # The CLI's order: PULUMI_BACKEND_URL, then Pulumi.yaml `backend.url` (as cloudstation_tools/state_backend.py).
    url = env.get("PULUMI_BACKEND_URL") or _project_backend(root)
    if not url and state.is_dir():
        url = additions["PULUMI_BACKEND_URL"] = local_url(root)
    passphrase = state / PASSPHRASE_FILE
    if url and _is_local(url, root) and not _passphrase_set(env) and passphrase.is_file():
        additions["PULUMI_CONFIG_PASSPHRASE_FILE"] = str(passphrase)
    return additions


def create(root: Path = ROOT, env: Mapping[str, str] = os.environ) -> None:
    """`.pulumi-state/` and a generated passphrase (mode 600), unless the user set a backend
    (then nothing is created: their backend, their passphrase). A passphrase is generated only
    for a backend without stacks: one made later would not open the secrets of existing stacks
    (their `encryptionsalt` comes from the passphrase they were created with)."""
    if env.get("PULUMI_BACKEND_URL") or _project_backend(root):
        return
    state = state_dir(root)
    state.mkdir(mode=0o700, exist_ok=True)
    passphrase = state / PASSPHRASE_FILE
    stacks = state / ".pulumi" / "stacks"
    has_stacks = stacks.is_dir() and any(path.is_file() for path in stacks.rglob("*"))
    if not passphrase.exists() and not _passphrase_set(env) and not has_stacks:
        descriptor = os.open(passphrase, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")


@contextlib.contextmanager
def applied(root: Path = ROOT, env: MutableMapping[str, str] = os.environ) -> Iterator[dict[str, str]]:
    """`defaults` set in `env` (os.environ: seen by the `pulumi` processes started meanwhile) and
    removed again on exit, so an in-process caller (the tests) is left as it was."""
    additions = defaults(root, env)
    env.update(additions)
    try:
        yield additions
    finally:
        for name in additions:
            env.pop(name, None)


def shell_exports(additions: Mapping[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in additions.items())


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cloudstation_tools.local_backend", description=__doc__.splitlines()[0])
    parser.add_argument("--create", action="store_true", help="create .pulumi-state/ and its passphrase first")
    parser.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = Path(args.root)
    if args.create:
        create(root)
    sys.stdout.write(shell_exports(defaults(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
