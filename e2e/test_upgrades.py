"""Scenario step 4: every pin group of infra/versions.py bumped alone; the real engine's plan
(`pulumi preview --json`) against what the offline engine model (cloudstation_tools/engine.py, which
`cloudstation diff` and the upgrade tests use) predicts from two mock renders. Where they differ the
real engine is right, and the model is wrong: the failure names each resource and both answers."""
from __future__ import annotations

import json
import re

import pytest

from cloudstation_tools import engine
from e2e.platform import Platform

VERSION_CONSTANTS = ("ARMADA", "CLOUDSTATE_OPERATOR", "CLOUDSTATE_PROXY")
"""Tags several pins share (infra/versions.py): a release bumps them together, as the unit tests do
(tests/test_engine_replacements.py pin_groups)."""
REPLACING = {"replace", "create-replacement", "delete-replaced"}


def pin_groups(versions_text: str) -> dict[str, list[str]]:
    """TAGS entries of infra/versions.py (the copy's text) grouped as a release bumps them: those
    whose tag is a version constant's, together; every other alone."""
    constants = dict(re.findall(r'^([A-Z_]+) = "([^"]+)"$', versions_text, re.M))
    entries = re.findall(r'^    "([\w-]+)": f?"([^"]+)",$', versions_text, re.M)
    groups: dict[str, list[str]] = {}
    for key, ref in entries:
        shared = [c for c in VERSION_CONSTANTS if "{" + c + "}" in ref or ref.endswith(":" + constants.get(c, "\0"))]
        groups.setdefault(shared[0] if shared else key, []).append(key)
    return groups


def bump(versions_text: str, group: str, keys: list[str]) -> str:
    """The text with the group's tag(s) changed, as a release would change them."""
    if group in VERSION_CONSTANTS:
        return re.sub(rf'^{group} = "([^"]+)"$', rf'{group} = "\1-bumped"', versions_text, flags=re.M)
    [key] = keys
    return re.sub(rf'^(    "{re.escape(key)}": "[^"]+)",$', r'\1-bumped",', versions_text, flags=re.M)


REPIN = """
import hashlib, json, sys
import yaml
from infra import versions
path = versions.DIGESTS_FILE
records = yaml.safe_load(path.read_text()) or {}
for name, record in records.items():
    ref = versions.TAGS.get(name)
    if ref and record["ref"] != ref:  # a bumped pin: record it as pin-images would
        record.update(ref=ref, digest="sha256:" + hashlib.sha256(ref.encode()).hexdigest(), source="e2e bump")
path.write_text(yaml.safe_dump(records, sort_keys=False))
"""
"""What `python -m infra pin-images` does after a bump, offline: the bumped pins that had a digest get
one (made up: nothing pulls in this tier), so the stack does not refuse them (infra/stack_images.py);
pins a stack lists in `platform.images.allowUnpinned` stay unpinned."""


def rendered_resources(platform: Platform, stack: str, out: str) -> list[dict]:
    platform.python("-m", "infra", "render", "--stack", stack, "--out", out).check()
    return json.loads((platform.repo / out / "resources.json").read_text())


def model_ops(before: list[dict], after: list[dict]) -> dict[str, str]:
    """Kubernetes object URN -> replace | update, as cloudstation_tools/engine.py predicts (it models
    the Kubernetes provider's diff only); created or deleted objects show as such."""
    old, new = engine.Graph(before), engine.Graph(after)
    ops = {change.new.urn: "replace" if change.replaced else "update" for change in engine.changes(old, new)}
    ops.update({o.urn: "create" for o in new.objects if o.urn not in old.by_urn})
    ops.update({o.urn: "delete" for o in old.objects if o.urn not in new.by_urn})
    return ops


def real_ops(steps: dict[str, dict], objects: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(Kubernetes objects, everything else): URN -> the engine's op, replacements as `replace`."""
    ops: dict[str, str] = {}
    for urn, step in steps.items():
        op = "replace" if step["op"] in REPLACING else step["op"]
        if op not in ("same", "read", "refresh"):
            ops[urn] = op
    return ({u: o for u, o in ops.items() if u in objects}, {u: o for u, o in ops.items() if u not in objects})


@pytest.mark.after("test_3_promote_and_up_prod")
@pytest.mark.parametrize("stack", ["test", "prod"])
def test_4_every_pin_bump_plans_what_the_engine_model_predicts(platform: Platform, stack: str):
    versions_file = platform.repo / "infra" / "versions.py"
    digests_file = platform.repo / "infra" / "image-digests.yaml"
    original, original_digests = versions_file.read_text(), digests_file.read_text()
    before = rendered_resources(platform, stack, f".cloudstation/e2e/{stack}/before")
    text = json.dumps(before)
    groups = {g: keys for g, keys in pin_groups(original).items() if g in VERSION_CONSTANTS or any(
        f'"{k}"' in original and re.search(rf'^    "{re.escape(k)}": f?"[^"]*?([^/"]+)",$', original, re.M) for k in keys)}
    differences, checked = [], []
    with platform.port_forwards(stack):
        try:
            for group, keys in groups.items():
                bumped = bump(original, group, keys)
                assert bumped != original, f"could not bump {group} ({keys})"
                versions_file.write_text(bumped)
                digests_file.write_text(original_digests)
                platform.python("-c", REPIN).check()
                after = rendered_resources(platform, stack, f".cloudstation/e2e/{stack}/{group}")
                if json.dumps(after) == text:
                    continue  # a pin this stack does not deploy: nothing to plan
                predicted = model_ops(before, after)
                objects = {o.urn for o in engine.Graph(before).objects} | {o.urn for o in engine.Graph(after).objects}
                planned, others = real_ops(platform.preview_steps(stack), objects)
                checked.append(group)
                print(f"[e2e] {stack} {group}: {len(planned)} objects change, other resources {others}")
                for urn in sorted(set(predicted) | set(planned)):
                    if predicted.get(urn) != planned.get(urn):
                        differences.append(f"{group}: {urn}: engine {planned.get(urn, 'same')}, "
                                           f"model {predicted.get(urn, 'same')}")
        finally:
            versions_file.write_text(original)
            digests_file.write_text(original_digests)
    assert checked, f"no pin group changes the {stack} stack"
    assert not differences, "\n".join(differences)
