"""Promotion: copy the test stack's deployed, digest-pinned image references into the prod stack file.

    python -m infra promote --from test --to prod [--project P ...] [--entity P/E ...] [--dry-run]
    python -m infra rollback --stack prod [--dry-run]

A promotion, in this order (any refusal leaves the stack file, the registry and the history as
they were):
1. read the test stack's `images` output (`"<project>/<entity>" -> ref@sha256:…`) from its state;
2. refuse unless every selected entity is on both sides and every test reference is digest-pinned;
3. fetch each manifest by digest from its registry (refuse if any is missing);
4. compute the exact edit of Pulumi.<to>.yaml and validate the result as the program would;
5. tag each promoted manifest `<to>` and `<to>-<UTC timestamp>` inside its registry (manifest
   bytes only, no layers);
6. write the stack file atomically and append a record to promotions.<to>.jsonl beside it.

`rollback` undoes the latest promotion that has not been rolled back, the same way, and records
that too. Registry credentials are read by infra/registry_api.py and never printed.
"""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Optional

from infra import registry_api, stack_file, state_backend
from infra.config import DIGEST_REF, ConfigError

IMAGES_OUTPUT = "images"


class PromotionRefused(Exception):
    """Nothing was changed; str() lists every reason."""

    def __init__(self, problems: list[str], what: str = "promotion"):
        self.problems = problems
        super().__init__(f"{what} refused, nothing was changed:\n" + "\n".join(f"  {p}" for p in problems))


@dataclass(frozen=True)
class Change:
    key: str
    path: str
    previous: Optional[str]
    new: str


@dataclass
class Result:
    stack_file: Path
    changes: list[Change]
    diff: str
    tags: list[str]
    dry_run: bool
    stats: registry_api.Stats = field(default_factory=registry_api.Stats)
    record: Optional[dict] = None


def stack_path(root: Path, stack: str) -> Path:
    return root / f"Pulumi.{stack}.yaml"


def history_path(root: Path, stack: str) -> Path:
    return root / f"promotions.{stack}.jsonl"


def read_history(root: Path, stack: str) -> list[dict]:
    path = history_path(root, stack)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def select(
    images: dict[str, str], slots: dict[str, stack_file.ImageSlot], projects: Iterable[str], entities: Iterable[str],
    source: str, target: str,
) -> dict[str, str]:
    """The test references to promote, keyed `<project>/<entity>`; refuses on any problem."""
    projects, entities = list(projects), list(entities)
    problems: list[str] = []
    both = set(images) | set(slots)
    if not projects and not entities:
        keys = both
    else:
        keys = set()
        for project in projects:
            found = {k for k in both if k.split("/", 1)[0] == project}
            if not found:
                problems.append(f"--project {project}: no such project in the {source} stack or Pulumi.{target}.yaml")
            keys |= found
        for entity in entities:
            if "/" not in entity:
                problems.append(f"--entity {entity!r}: must be <project>/<entity>, e.g. shop/cart")
            elif entity not in both:
                problems.append(f"--entity {entity}: no such entity in the {source} stack or Pulumi.{target}.yaml")
            keys.add(entity)
        keys &= both
    for key in sorted(keys):
        if key not in images:
            problems.append(
                f"{key}: in Pulumi.{target}.yaml ({slots[key].path}) but missing from the {source} stack's "
                f"`{IMAGES_OUTPUT}` output — deploy it to {source} first"
            )
        elif key not in slots:
            problems.append(
                f"{key}: deployed in {source} but missing from Pulumi.{target}.yaml — add the entity to "
                f"{stack_file.PROJECTS} there first"
            )
        elif not isinstance(images[key], str) or not DIGEST_REF.match(images[key]):
            problems.append(
                f"{key}: the {source} reference {images[key]!r} is not pinned by digest "
                f"(<registry>/<repository>[:tag]@sha256:<64 hex>)"
            )
    if problems:
        raise PromotionRefused(problems)
    return {key: images[key] for key in sorted(keys)}


class _Registries:
    """One client per registry host, and their combined cost."""

    def __init__(self, connect: Callable[[str], registry_api.Registry]):
        self.connect = connect
        self.clients: dict[str, registry_api.Registry] = {}

    def __call__(self, host: str) -> registry_api.Registry:
        if host not in self.clients:
            self.clients[host] = self.connect(host)
        return self.clients[host]

    def stats(self) -> registry_api.Stats:
        total = registry_api.Stats()
        for client in self.clients.values():
            total.add(client.stats)
        return total


def _fetch(refs: dict[str, str], registries: _Registries, what: str) -> dict[str, registry_api.Manifest]:
    """Each reference's manifest from its registry; refuses if any digest is not there."""
    manifests, problems = {}, []
    for key, ref in refs.items():
        image = registry_api.ImageRef.parse(ref)
        try:
            manifest = registries(image.registry).manifest(image)
        except registry_api.RegistryError as error:
            problems.append(f"{key}: {error}")
            continue
        if manifest is None:
            problems.append(f"{key}: {image.digest} is not in the registry ({image.registry}/{image.repository})")
        else:
            manifests[key] = manifest
    if problems:
        raise PromotionRefused(problems, what)
    return manifests


def _apply(
    root: Path, stack: str, refs: dict[str, str], record: dict, *, dry_run: bool,
    connect: Callable[[str], registry_api.Registry], now: Optional[datetime], what: str,
) -> Result:
    path = stack_path(root, stack)
    text = stack_file.read_text(path)
    slots = stack_file.image_slots(text, path.name)
    changes = [Change(k, slots[k].path, slots[k].value, ref) for k, ref in refs.items() if slots[k].value != ref]
    registries = _Registries(connect)
    manifests = _fetch({c.key: c.new for c in changes}, registries, what)
    try:
        new_text = stack_file.edit(text, {c.key: c.new for c in changes}, path.name)
        stack_file.validate(new_text, root, path.name)
    except (ConfigError, stack_file.StackFileError) as error:  # the edit would not be a valid stack file
        raise PromotionRefused([str(error)], what) from None
    diff = "".join(difflib.unified_diff(
        text.splitlines(keepends=True), new_text.splitlines(keepends=True), f"a/{path.name}", f"b/{path.name}"
    ))
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    tags = [stack, f"{stack}-{when:%Y%m%dT%H%M%SZ}"]
    result = Result(path, changes, diff, tags, dry_run)
    if dry_run or not changes:
        result.stats = registries.stats()
        return result
    for change in changes:
        image = registry_api.ImageRef.parse(change.new)
        for tag in tags:
            try:
                registries(image.registry).tag(image, manifests[change.key], tag)
            except registry_api.RegistryError as error:
                # Tags already added stay (they only mark images); the stack file is not written.
                raise PromotionRefused([f"{change.key}: {error}"], what) from None
    stack_file.write_atomic(path, new_text, expected=text)
    history = read_history(root, stack)
    result.record = {
        "id": len(history) + 1,
        "when": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        **record,
        "references": {c.key: c.new for c in changes},
        "previous": {c.key: c.previous for c in changes},
        "tags": tags,
    }
    _append(history_path(root, stack), result.record)
    result.stats = registries.stats()
    return result


def _append(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def promote(
    source: str = "test", target: str = "prod", *, root: Path, projects: Iterable[str] = (),
    entities: Iterable[str] = (), dry_run: bool = False, backend: Optional[str] = None,
    images: Optional[dict] = None, connect: Callable[[str], registry_api.Registry] = registry_api.connect,
    now: Optional[datetime] = None,
) -> Result:
    """Promote `source`'s deployed images into Pulumi.<target>.yaml (`images` overrides reading the state)."""
    if images is None:
        images = state_backend.stack_output(source, IMAGES_OUTPUT, backend=backend, root=root)
    if not isinstance(images, dict):
        raise PromotionRefused([f"the {source} stack's `{IMAGES_OUTPUT}` output is not a map: {images!r}"])
    path = stack_path(root, target)
    slots = stack_file.image_slots(stack_file.read_text(path), path.name)
    refs = select(images, slots, projects, entities, source, target)
    record = {"action": "promote", "from": source, "to": target}
    return _apply(root, target, refs, record, dry_run=dry_run, connect=connect, now=now, what="promotion")


def rollback(
    stack: str = "prod", *, root: Path, dry_run: bool = False,
    connect: Callable[[str], registry_api.Registry] = registry_api.connect, now: Optional[datetime] = None,
) -> Result:
    """Restore the references the latest not-yet-rolled-back promotion replaced."""
    history = read_history(root, stack)
    undone = {r.get("undoes") for r in history if r.get("action") == "rollback"}
    active = [r for r in history if r.get("action") == "promote" and r["id"] not in undone]
    if not active:
        raise PromotionRefused([f"{history_path(root, stack).name} has no promotion left to roll back"], "rollback")
    last = active[-1]
    path = stack_path(root, stack)
    slots = stack_file.image_slots(stack_file.read_text(path), path.name)
    problems = []
    for key, ref in last["references"].items():
        current = slots[key].value if key in slots else None
        if current != ref:
            problems.append(
                f"{key}: Pulumi.{stack}.yaml has {current!r}, not {ref!r} written by promotion {last['id']} "
                f"({last['when']}); it changed since, so restore it by hand or promote again"
            )
        elif last["previous"].get(key) is None:
            problems.append(f"{key}: promotion {last['id']} added this image; remove its `image:` line by hand")
    if problems:
        raise PromotionRefused(problems, "rollback")
    record = {"action": "rollback", "from": stack, "to": stack, "undoes": last["id"]}
    return _apply(
        root, stack, dict(last["previous"]), record, dry_run=dry_run, connect=connect, now=now, what="rollback"
    )
