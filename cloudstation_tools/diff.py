"""`cloudstation diff --stack S [--against REF]`: what `pulumi up` of the working tree would do to the
stack, offline, against a baseline render (cloudstation_tools/baseline.py: the last deployment from
this checkout, else git HEAD; or a git ref, or a render directory).

For Kubernetes objects the engine's rules decide (cloudstation_tools/engine.py `changes`: which field
changes the provider answers with a replacement, whether it deletes first, and what the API server
would refuse in place); for other resources (generated passwords, images, queues) only that their
inputs changed is known here: `pulumi preview` says whether their providers replace them, and stays
the authority for changes made outside the program.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterable

from cloudstation_tools import engine

ACTIONS = ("replace", "update", "create", "delete", "kept")
SHOWN_PATHS = 6
"""Changed paths listed per update; the rest are counted."""


@dataclass(frozen=True)
class Step:
    action: str
    urn: str
    label: str
    why: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


def _label(resource: engine.Resource) -> str:
    return resource.label() if resource.is_object else f"{resource.type} {resource.name}"


def _path(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(path))


def _listed(paths: Iterable[str]) -> list[str]:
    paths = list(paths)
    return paths[:SHOWN_PATHS] + ([f"... and {len(paths) - SHOWN_PATHS} more"] if len(paths) > SHOWN_PATHS else [])


def _change_step(change: engine.Change) -> Step:
    if not change.replaced:
        return Step("update", change.new.urn, _label(change.new),
                    tuple(f"{p}: changed in place" for p in _listed(_path(p) for p in change.paths)), tuple(change.problems()))
    order = "deleted first, then created (same name)" if change.delete_before_replace(bool(change.provider_replaces)) \
        else "created first, then the old one deleted"
    why = [f"{_path(p)}: the provider replaces the object on this change (forceNew)" for p in change.provider_replaces]
    why += [f"{_path(p)}: replaceOnChanges of the program" for p in change.program_replaces]
    others = [p for p in change.paths if p not in change.provider_replaces and p not in change.program_replaces]
    why += [f"{p}: changed with it" for p in _listed(_path(p) for p in others)]
    return Step("replace", change.new.urn, _label(change.new), (*why, f"order: {order}"), tuple(change.problems()))


DYNAMIC_PROVIDER = "__provider"
"""A dynamic resource's serialized provider (pulumi/dynamic): its pickled code, which differs with the
directory and interpreter it was rendered from; the resource's own settings are its other inputs."""


def _settings(inputs: dict) -> dict:
    return {key: value for key, value in inputs.items() if key != DYNAMIC_PROVIDER}


def steps(before: engine.Graph, after: engine.Graph) -> list[Step]:
    """Every resource `pulumi up` would create, update, replace, delete or leave in the cluster."""
    found = [_change_step(change) for change in engine.changes(before, after)]
    objects = {r.urn for r in after.objects}
    for resource in after.resources:
        old = before.by_urn.get(resource.urn)
        if old is None or resource.urn in objects or not resource.custom:
            continue
        paths = [_path(p) for p, _ in engine.changed_paths(_settings(old.inputs), _settings(resource.inputs))]
        if not paths:
            continue
        found.append(Step("update", resource.urn, _label(resource), (
            *(f"{p}: changed" for p in _listed(paths)),
            "not a Kubernetes object: `pulumi preview` says whether its provider replaces it")))
    for urn in sorted(set(after.by_urn) - set(before.by_urn)):
        if after.by_urn[urn].custom:
            found.append(Step("create", urn, _label(after.by_urn[urn])))
    for urn in sorted(set(before.by_urn) - set(after.by_urn)):
        old = before.by_urn[urn]
        if not old.custom:
            continue
        if old.options.get("retainOnDelete"):
            found.append(Step("kept", urn, _label(old), ("retainOnDelete: dropped from the stack's state, left in "
                                                         "the cluster with its data (docs/teardown-and-upgrades.md)",)))
        else:
            found.append(Step("delete", urn, _label(old)))
    return sorted(found, key=lambda s: (ACTIONS.index(s.action), s.label))


def summary(stack: str, found: list[Step]) -> str:
    counts = {action: sum(s.action == action for s in found) for action in ACTIONS}
    problems = sum(len(s.problems) for s in found)
    text = (f"{stack}: {counts['replace']} to replace, {counts['update']} to update, {counts['create']} to create, "
            f"{counts['delete']} to delete, {counts['kept']} kept")
    return text + (f"; {problems} problem(s)" if problems else "")


def as_text(stack: str, described: str, found: list[Step]) -> str:
    lines = [f"== {stack}: against {described}"]
    for step in found:
        lines.append(f"{step.action:<7} {step.label}")
        lines += [f"    {why}" for why in step.why]
        lines += [f"    PROBLEM {problem}" for problem in step.problems]
    lines.append(summary(stack, found))
    return "\n".join(lines) + "\n"


def as_json(stack: str, described: str, found: list[Step]) -> str:
    return json.dumps({"version": 1, "stack": stack, "against": described, "summary": summary(stack, found),
                       "steps": [{**asdict(s), "why": list(s.why), "problems": list(s.problems)} for s in found]},
                      indent=2) + "\n"
