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
from tests import stacks
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


def _rotated(original):
    """The mocks' generated values, as a rotation changes them: a `--replace` of a RandomPassword
    (Armada's users, Redis), or of a KeptSecret whose Secret's values were changed or removed first
    (docs/operations.md, docs/teardown-and-upgrades.md)."""
    def made_up(name: str):
        def outputs(inputs: dict) -> dict:
            salt = hashlib.sha256(f"rotated:{name}".encode()).hexdigest()

            def rotate(value):
                if isinstance(value, dict):
                    return {key: rotate(item) for key, item in value.items()}
                return (salt * 2)[:len(value)]

            return {key: mocks.as_secret(rotate(value["value"])) for key, value in original(name)(inputs).items()}

        return outputs

    return made_up


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
        patch.setattr(mocks, "_random_password", _rotated(mocks._random_password))
        patch.setattr(mocks, "_kept_secret", _rotated(mocks._kept_secret))
        after = _graph(stacks.render(stack, stack_file=stacks.read(stack)))  # prod: as promoted
    changes = engine.changes(before, after)
    kept = [c for c in changes if c.new.kind == "Secret" and c.old.options.get("retainOnDelete")]
    assert kept, "no kept Secret changed: the rotation did not reach them"
    if stack == "test":
        assert any(c.new.object_name == "registry-auth" for c in kept)
    assert [p for c in changes for p in c.problems()] == []


# --- deploying again over kept objects (docs/teardown-and-upgrades.md) -----------------------------

KEPT_SECRET = "pulumi-python:dynamic/secrets:KeptSecret"
RANDOM_PASSWORD = "random:index/randomPassword:RandomPassword"


def _kept_secrets(rendered: render.Rendered) -> dict[tuple[str, str], "render.Registration"]:
    """(namespace, name) -> each Secret the stack keeps (retainOnDelete)."""
    return {(r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]): r
            for r in rendered.of_type("kubernetes:core/v1:Secret") if r.options.get("retainOnDelete")}


@pytest.mark.parametrize("stack", ["test", "prod", "non-owner"])
def test_every_kept_secret_applies_the_values_read_back_from_it(rendered_stacks, stack):
    """A kept Secret's generated values come from a KeptSecret of that very Secret (components/kept_secret.py:
    read back when the Secret exists), never from a RandomPassword, whose new values a stack deployed
    again would apply over the kept ones (a server-side apply conflict, and a store refusing its clients).
    `non-owner` runs its project on a managed Cassandra (tests/stacks/)."""
    from tests.stacks import rendered as variant

    rendered = rendered_stacks[stack] if stack in rendered_stacks else variant(stack)
    by_urn = {r.urn: r for r in rendered.registrations}
    readers = {(r.inputs["namespace"], r.inputs["name"]): r for r in rendered.of_type(KEPT_SECRET)}
    kept = _kept_secrets(rendered)
    assert readers and set(readers) == set(kept), "every KeptSecret reads a Secret the stack keeps, and only those"
    for key, secret in kept.items():
        assert readers[key].urn in secret.dependencies, key
        assert RANDOM_PASSWORD not in {by_urn[urn].type for urn in secret.dependencies if urn in by_urn}, key
        assert readers[key].inputs["cluster"] is True and "context" not in readers[key].inputs, key
    if stack == "test":
        assert {name for _namespace, name in kept} >= {"registry-auth", "shop-postgres-credentials",
                                                        "armada-postgres-credentials"}
    if stack == "non-owner":
        assert any(r.inputs["lengths"] == {"password": 32, "lockout-password": 32} for r in readers.values())


@pytest.mark.parametrize("kubernetes, reads", [
    ({}, {"cluster": True}),
    ({"context": "kind-lab"}, {"cluster": True, "context": "kind-lab"}),
    ({"renderYamlToDirectory": "rendered/test"}, {"cluster": False}),  # no cluster: the current context may be another one
])
def test_kept_secrets_read_the_cluster_the_stacks_provider_deploys_to(kubernetes, reads):
    from tests.stacks import edited

    rendered = stacks.render("test", stack_file=edited("test", kubernetes=lambda _old: kubernetes))
    readers = rendered.of_type(KEPT_SECRET)
    assert len(readers) == len(_kept_secrets(rendered)) > 0
    for reader in readers:
        assert {key: reader.inputs[key] for key in ("cluster", "context") if key in reader.inputs} == reads, reader.name


def test_a_stack_deployed_over_kept_secrets_applies_exactly_what_they_hold(tmp_path, monkeypatch):
    """`pulumi up` after `pulumi destroy` (kept Secrets hold the previous deployment's values), and the
    upgrade from the RandomPassword resources (the Secrets hold their values): the real KeptSecret
    provider reads each Secret through the Kubernetes API (a fake one) and every kept Secret is applied
    with exactly the values it holds, the registry's htpasswd line included (bcrypt is salted: a new
    hash would differ). Server-side apply then shares the fields with the previous field manager
    instead of conflicting (pulumi-kubernetes provider/pkg/await/await.go `Creation`)."""
    from cloudstation_tools.mocks import DynamicProviderHost, ProgramMocks, is_kept_secret
    from components import kept_secret, kube_tunnel
    from tests.fake_kube_api import FakeKubeApi

    first = stacks.render("test")  # which Secrets the stack keeps, and what it generates in them
    with FakeKubeApi() as api:
        monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        monkeypatch.setattr(kube_tunnel, "_configurations", {})
        held: dict[tuple[str, str], dict[str, str]] = {}
        for reader in first.of_type(KEPT_SECRET):
            key, inputs = (reader.inputs["namespace"], reader.inputs["name"]), reader.inputs
            values = {name: f"previous{index}{name.replace('-', '')}" for index, name in enumerate(sorted(inputs["lengths"]))}
            if inputs.get("htpasswd"):
                spec = inputs["htpasswd"]
                values[spec["key"]] = kept_secret.bcrypt_htpasswd(spec["username"], values[spec["passwordKey"]])
            held[key] = values
            api.add_secret(*key, {**values, "username": "kept"})
        host = DynamicProviderHost(types=is_kept_secret)
        again = stacks.render("test", mocks=ProgramMocks(dynamic=host))
    assert sorted(host.calls_of("create")) == sorted(r.name for r in first.of_type(KEPT_SECRET))
    kept = _kept_secrets(again)
    assert set(kept) == set(held)
    for key, secret in kept.items():
        applied = _reveal(secret.inputs["stringData"])
        assert {name: applied[name] for name in held[key]} == held[key], key
        assert mocks.is_wrapped_secret(secret.inputs["stringData"]), key


def test_a_preview_of_new_kept_secrets_has_unknown_values_and_the_program_copes(monkeypatch):
    """In a preview the engine does not create a dynamic resource (no `supportsPreview`): a new
    KeptSecret's values are unknown (a first deployment, the upgrade from RandomPassword), and
    everything made from them (Secrets, pull Secrets, build credentials, stack outputs) too."""
    from pulumi.runtime import rpc

    from pulumi.output import Unknown

    monkeypatch.setattr(mocks, "_kept_secret", lambda name: lambda inputs: {"values": rpc.UNKNOWN})
    rendered = stacks.render("test", preview=True)
    kept = _kept_secrets(rendered)
    assert kept
    for secret in kept.values():
        data = _reveal(secret.inputs["stringData"])
        assert isinstance(data, Unknown) or isinstance(data["password"], Unknown), secret.name
    assert rendered.outputs["registryPassword"] == render.SECRET


def test_deploying_again_over_kept_objects_needs_no_environment_variables():
    """A create under server-side apply is an apply (pulumi-kubernetes await.go `Creation`: "we currently
    always upsert the object"), and kept Secrets are applied with the values they hold: the docs no
    longer send anyone to upsertExistingObjects or a forced apply, which overwrote kept passwords."""
    found = [f"{doc.name}: {line}" for doc in DOCS for line in doc.read_text().splitlines()
             if re.search(r"PULUMI_K8S_(UPSERT_EXISTING_OBJECTS|ENABLE_PATCH_FORCE)", line)]
    assert found == []
