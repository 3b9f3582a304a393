"""The team's standards, checked on every object both stack files render."""
from __future__ import annotations

import pytest

from cloudstation_tools import checks, validate
from tests.conftest import objects

CHECKS = [
    checks.restricted_violations,
    checks.resource_violations,
    checks.image_violations,
    checks.secret_env_violations,
]


def test_every_object_validates_against_the_official_schemas_and_its_crd(rendered, rendered_stacks):
    # A stack that does not own the cluster-scoped objects uses the CRDs the owning stack installs.
    crds = [o for other in rendered_stacks.values() for o in objects(other, "CustomResourceDefinition")]
    problems = validate.validate_all(rendered.manifests(), extra_crds=crds)
    assert problems == []


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_every_workload_meets_the_standard(rendered, check):
    problems = [p for name, spec in checks.workloads(rendered.manifests()) for p in check(name, spec)]
    assert problems == []


def test_every_object_is_named_explicitly(rendered):
    assert [o for o in rendered.manifests() if not o["metadata"].get("name")] == []


def test_secrets_stay_out_of_configmaps(rendered):
    """ConfigMaps hold no redacted (secret-derived) values and no password-looking keys."""
    for config_map in objects(rendered, "ConfigMap"):
        for key, value in (config_map.get("data") or {}).items():
            assert "[secret]" not in value, f"{config_map['metadata']['name']}/{key}"
            assert not checks.SECRET_ENV_NAME.search(key), f"{config_map['metadata']['name']}/{key}"


def test_every_child_is_parented_and_named_from_its_component(rendered):
    components = {r.urn: r for r in rendered.registrations if not r.custom}
    for registration in rendered.registrations:
        if registration.type.startswith("pulumi:providers:") or not registration.custom:
            continue  # providers and top-level components sit at the stack's root
        parent = components.get(registration.parent)
        assert parent is not None, f"{registration.urn} is not inside a component"
        assert registration.name.startswith(parent.name), f"{registration.name} not named from {parent.name}"


def test_component_type_tokens_follow_the_convention(rendered):
    for registration in rendered.registrations:
        if not registration.custom:
            package, module, kind = registration.type.split(":")
            assert package == "cloudstation" and module and kind[0].isupper(), registration.type


def test_the_checks_catch_bad_workloads():
    bad = {"containers": [{"name": "app", "image": "nginx:latest", "env": [{"name": "DB_PASSWORD", "value": "x"}]}],
           "hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    found = [p for check in CHECKS for p in check("Deployment x/bad", bad)]
    for fragment in ("hostNetwork", "hostPath", "allowPrivilegeEscalation", "drop ALL", "runAsNonRoot", "seccompProfile",
                     "readOnlyRootFilesystem", "no cpu request", "uses latest", "DB_PASSWORD is a literal"):
        assert any(fragment in p for p in found), fragment
    untagged = {"containers": [{"name": "app", "image": "docker.io/library/nginx"}]}
    assert checks.image_violations("x", untagged)


def _waits_for(rendered) -> dict[str, set[str]]:
    """urn -> every urn it waits for: its dependencies, transitively; a dependency on a component
    waits for all of the component's children (Pulumi's semantics)."""
    children: dict[str, set[str]] = {}
    for registration in rendered.registrations:
        children.setdefault(registration.parent, set()).add(registration.urn)
    components = {r.urn for r in rendered.registrations if not r.custom}
    direct = {r.urn: set(r.dependencies) for r in rendered.registrations}

    def closure(urn: str) -> set[str]:
        seen: set[str] = set()
        pending = list(direct[urn])
        while pending:
            dep = pending.pop()
            if dep in seen:
                continue
            seen.add(dep)
            pending += direct.get(dep, set()) | (children.get(dep, set()) if dep in components else set())
        return seen

    return {urn: closure(urn) for urn in direct}


def test_every_namespaced_object_waits_for_its_namespace(rendered):
    """On a first `pulumi up` an object created before its namespace fails ("namespace not found")."""
    namespaces = {r.inputs["metadata"]["name"]: r.urn for r in rendered.of_type("kubernetes:core/v1:Namespace")}
    waits_for = _waits_for(rendered)
    problems = []
    for registration in rendered.registrations:
        if not registration.custom or not registration.type.startswith("kubernetes:"):
            continue
        namespace = (registration.inputs.get("metadata") or {}).get("namespace")
        if namespace in namespaces and namespaces[namespace] not in waits_for[registration.urn]:
            problems.append(f"{registration.type} {namespace}/{registration.inputs['metadata'].get('name')}")
    assert problems == []


def test_custom_resources_wait_for_their_definitions(rendered):
    definitions = {
        (r.inputs["spec"]["group"], r.inputs["spec"]["names"]["kind"]): r.urn
        for r in rendered.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    }
    waits_for = _waits_for(rendered)
    for registration in rendered.registrations:
        api_version = registration.inputs.get("apiVersion", "") if registration.custom else ""
        key = (api_version.rpartition("/")[0], registration.inputs.get("kind"))
        if key in definitions:
            assert definitions[key] in waits_for[registration.urn], registration.urn
