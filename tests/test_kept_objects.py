"""Kept objects (`retainOnDelete`, docs/cloudstate.md "What is kept") on a later `pulumi up`.

The engine never deletes a kept object, not even to replace it (pulumi/pulumi
pkg/resource/deploy/step.go `DeleteStep.Apply`), and pulumi-kubernetes refuses to create an object
that exists (provider/pkg/await/await.go `Creation`: AlreadyExists unless upsertExistingObjects).
So a kept object must never be replaced under its own name: a change the provider answers with a
replacement would fail the `up` and drop the object from the state. Secrets are the ones that
change (a rotated password): pulumi-kubernetes replaces a Secret whose data changes unless the
provider has `enableSecretMutable` (provider/pkg/provider/diff.go `forceNewProperties`).
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from cloudstation_tools import engine, mocks, render
from tests import promoted
from tests.test_engine_replacements import _changed, _object

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))


def test_a_kept_object_replaced_under_its_name_collides_even_when_deleting_first():
    secret = _object("Secret", "core/v1", type="Opaque", stringData={"password": "a"}, options={"retainOnDelete": True})
    change = _changed(secret, stringData={"password": "b"})
    assert change.replaced and change.delete_before_replace(True)
    assert any("retainOnDelete" in p and "collides" in p for p in change.problems())
    # Not kept: deleting first is enough.
    assert _changed(_object("Secret", "core/v1", type="Opaque", stringData={"password": "a"}),
                    stringData={"password": "b"}).problems() == []
    # Kept and updated in place (the program's provider config): nothing to collide with.
    mutable = _changed(secret, provider_config={"enableSecretMutable": "true"}, stringData={"password": "b"})
    assert not mutable.replaced and mutable.problems() == []


def _rotated(name: str):
    """The mocks' generated password, as a `--replace` of every RandomPassword would change it."""
    original = _ROTATE_FROM(name)

    def outputs(inputs: dict) -> dict:
        values = original(inputs)
        salt = hashlib.sha256(f"rotated:{name}".encode()).hexdigest()
        for key in ("result", "bcryptHash"):
            values[key] = mocks.as_secret(salt[: len(values[key]["value"])])
        return values

    return outputs


_ROTATE_FROM = mocks._random_password


def _reveal(value):
    """Inputs as the engine diffs them: secret values compared, not redacted (render.clean)."""
    if mocks.is_wrapped_secret(value):
        return _reveal(value["value"])
    if isinstance(value, dict):
        return {k: _reveal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_reveal(v) for v in value]
    return value


def _graph(rendered: render.Rendered) -> engine.Graph:
    entries = rendered.resources()
    by_urn = {r.urn: r for r in rendered.registrations}
    for entry in entries:
        entry["inputs"] = render.clean(_reveal(by_urn[entry["urn"]].inputs))
    return engine.Graph(entries)


@pytest.mark.parametrize("stack", ["test", "prod"])
def test_rotating_generated_passwords_keeps_the_kept_secrets_in_the_state(rendered_stacks, stack):
    """docs/operations.md "Rotate the registry password" (and any store password): every kept
    Secret whose data changes is updated in place, none is replaced under its own name."""
    before = _graph(rendered_stacks[stack])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mocks, "_random_password", _rotated)
        after = _graph(render.render(stack, stack_file=promoted.read(stack)))  # prod: as promoted
    changes = engine.changes(before, after)
    kept = [c for c in changes if c.new.kind == "Secret" and c.old.options.get("retainOnDelete")]
    assert kept, "no kept Secret changed: the rotation did not reach them"
    if stack == "test":
        assert any(c.new.object_name == "registry-auth" for c in kept)
    assert [p for c in changes for p in c.problems()] == []


def test_adopting_kept_objects_is_documented_with_force():
    """A kept Secret holds the previous deployment's values under the previous run's field managers;
    the new stack generates new ones, so its server-side apply conflicts unless forced
    (await.go `Creation` -> `patchForce`, `handleSSAErr`; provider.go `fieldManagerName`: a new
    manager per resource)."""
    commands = [line for doc in DOCS for line in doc.read_text().splitlines()
                if re.search(r"PULUMI_K8S_UPSERT_EXISTING_OBJECTS=true", line)]
    assert commands, "the docs no longer say how to deploy again over kept objects"
    for line in commands:
        assert "PULUMI_K8S_ENABLE_PATCH_FORCE=true" in line, line
