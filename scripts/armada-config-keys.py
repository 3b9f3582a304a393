#!/usr/bin/env python3
"""Record the upstream Armada facts the tests rely on in tests/upstream/armada-v<version>.yaml.

The tests check our generated Armada configs against Armada's own files at the pinned version
(infra/versions.py ARMADA): the key paths of each service's built-in default config, a few default
values, the key shapes of its auth examples and `.armadactl.yaml`, and the Helm chart's
ClusterRoles. A clone of this repository carries those facts in that small data file; this script
writes it from an armadaproject/armada checkout at the tag:

    git clone --depth 1 --branch v0.22.7 https://github.com/armadaproject/armada /tmp/armada
    python scripts/armada-config-keys.py --from /tmp/armada
    python scripts/armada-config-keys.py --from /tmp/armada --check     # exit 1 if the data file differs

`--from` may also name a partial copy of the checkout (e.g. only its `config/` directory): the
entries whose files are absent there are kept as recorded, and the script says which. Every entry
records its file's git blob id, so `git -C /tmp/armada ls-tree v0.22.7 <path>` verifies it.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.versions import ARMADA  # noqa: E402

REPOSITORY = "https://github.com/armadaproject/armada"
TAG = f"v{ARMADA}"
DATA = ROOT / "tests" / "upstream" / f"armada-{TAG}.yaml"

SERVICES = ("server", "scheduler", "scheduleringester", "executor", "lookout", "lookoutingester",
            "eventingester", "binoculars", "lookouthc")

# What each file contributes: `keys` (its key tree: every map key, leaves null), `values` (the
# values at these dotted key paths) or `rules` (a Helm ClusterRole template's rules).
RECORD: dict[str, dict[str, Any]] = {
    **{f"config/{service}/config.yaml": {"keys": True, "values": ()} for service in SERVICES},
    "_local/server/config-auth.yaml": {"keys": True, "values": ()},
    "_local/scheduler/config-auth.yaml": {"keys": True, "values": ()},
    "_local/.armadactl.yaml": {"keys": True, "values": ()},
    "deployment/executor/templates/clusterrole.yaml": {"rules": True},
    "deployment/binoculars/templates/clusterrole.yaml": {"rules": True},
}
VALUES = {
    "config/server/config.yaml": ("corsAllowedOrigins", "metricsPort", "postgres.connection.dbname",
                                  "submission.allowedPriorityClassNames", "submission.defaultPriorityClassName"),
    "config/scheduler/config.yaml": ("metrics.port", "postgres.connection.dbname", "scheduling.executorUpdateFrequency"),
    "config/scheduleringester/config.yaml": ("postgres.connection.dbname",),
    "config/lookout/config.yaml": ("metricsPort", "postgres.connection.dbname", "postgres.connection.port"),
    "config/lookoutingester/config.yaml": ("metricsPort", "postgres.connection.dbname"),
    "config/eventingester/config.yaml": ("metricsPort",),
    "config/executor/config.yaml": ("executorApiConnection.forceNoTls", "metric.port",
                                    "task.allocateSpareClusterCapacityInterval"),
    "config/binoculars/config.yaml": ("auth.anonymousAuth", "metricsPort"),
}
for _path, _values in VALUES.items():
    RECORD[_path]["values"] = _values


def blob_id(data: bytes) -> str:
    """The git blob id of a file's bytes (what `git ls-tree <tag> <path>` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def key_tree(value: Any) -> Any:
    """Every map key of a YAML document, nested as in the file; anything else (lists too) is null."""
    if isinstance(value, Mapping):
        return {str(key): key_tree(item) for key, item in value.items()}
    return None


def value_at(document: Mapping, dotted: str) -> Any:
    node: Any = document
    for key in dotted.split("."):
        if not isinstance(node, Mapping) or key not in node:
            raise SystemExit(f"{dotted}: not a key path of the file")
        node = node[key]
    return node


def template_rules(text: str, path: str) -> list:
    """The `rules:` of a Helm ClusterRole template, which are plain YAML (the template directives
    are in its metadata only; refuse anything else rather than guess)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("rules:")), None)
    if start is None:
        raise SystemExit(f"{path}: no top-level `rules:`")
    body = "\n".join(lines[start:])
    if "{{" in body:
        raise SystemExit(f"{path}: template directives inside `rules:`; record them by hand")
    return yaml.safe_load(body)["rules"]


def entry(path: str, data: bytes) -> dict:
    wanted = RECORD[path]
    text = data.decode("utf-8")
    recorded: dict[str, Any] = {"blob": blob_id(data)}
    if wanted.get("rules"):
        recorded["rules"] = template_rules(text, path)
        return recorded
    document = yaml.safe_load(text) or {}
    recorded["keys"] = key_tree(document)
    if wanted["values"]:
        recorded["values"] = {dotted: value_at(document, dotted) for dotted in wanted["values"]}
    return recorded


def checkout_root(source: Path) -> Path:
    """The checkout (or partial copy) `source` names: its root, or its `config/` directory."""
    if (source / "config").is_dir():
        return source
    if source.name == "config" and any((source / s / "config.yaml").is_file() for s in SERVICES):
        return source.parent
    raise SystemExit(f"{source}: neither an armadaproject/armada checkout nor its config/ directory")


def git_commit(root: Path) -> Optional[str]:
    """The commit checked out at `root`, when it is a git work tree at the tag (else None)."""
    try:
        done = subprocess.run(["git", "-C", str(root), "describe", "--tags", "--exact-match", "HEAD"],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            return None
        if done.stdout.strip() != TAG:
            raise SystemExit(f"{root}: checked out at {done.stdout.strip()}, not {TAG}")
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    except FileNotFoundError:  # no git
        return None


def load(path: Path = DATA) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}


def generate(root: Path, current: dict) -> tuple[dict, list[str]]:
    """The data file's content from the files under `root`; entries whose file is absent there are
    kept from `current` (listed in the second value)."""
    files: dict[str, dict] = {}
    kept: list[str] = []
    old_files = current.get("files") or {}
    for path in RECORD:
        source = root / path
        if source.is_file():
            files[path] = entry(path, source.read_bytes())
        elif path in old_files and current.get("tag") == TAG:
            files[path] = old_files[path]
            kept.append(path)
        else:
            raise SystemExit(f"{source} is missing and {DATA.relative_to(ROOT)} has no record of it at {TAG}")
    commit = git_commit(root) or (current.get("commit") if current.get("tag") == TAG else None)
    data = {
        "repository": REPOSITORY,
        "tag": TAG,
        **({"commit": commit} if commit else {}),
        "recorded": current.get("recorded") if _same_files(current, files) else datetime.date.today().isoformat(),
        "generator": "scripts/armada-config-keys.py --from <armadaproject/armada checkout at the tag>",
        "files": files,
    }
    return data, kept


def _same_files(current: dict, files: dict) -> bool:
    return bool(current.get("recorded")) and current.get("files") == files


HEADER = """\
# Upstream facts the Armada tests rely on (tests/test_armada_config.py and its neighbours), recorded
# from armadaproject/armada at the tag below: per file its git blob id, its key tree (every map key,
# leaves null), the default values the tests read, or a Helm ClusterRole's rules.
# Generated by scripts/armada-config-keys.py; regenerate it, don't edit it.
"""


def dump(data: dict) -> str:
    return HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=120)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", type=Path, required=True,
                        help=f"armadaproject/armada checked out at {TAG} (or its config/ directory)")
    parser.add_argument("--out", type=Path, default=DATA, help="the data file (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="compare with the data file, write nothing")
    args = parser.parse_args(argv)
    current = load(args.out)
    data, kept = generate(checkout_root(args.source), current)
    for path in kept:
        print(f"kept as recorded (not in {args.source}): {path}", file=sys.stderr)
    if args.check:
        recorded = {k: v for k, v in current.items() if k != "recorded"}
        if recorded != {k: v for k, v in data.items() if k != "recorded"}:
            print(f"{args.out} differs from {args.source}: regenerate it without --check", file=sys.stderr)
            return 1
        print(f"{args.out} matches {args.source}")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump(data), encoding="utf-8")
    print(f"wrote {args.out} ({len(data['files'])} files, {TAG})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
