"""Deploy gating (issue 13 item 6) through one object per project: the ConfigMap `<project>-images`
(components/project_environment.py) depends on every build of its project and every StatefulService
of the project depends on it, so the graph has 2n edges, not n^2 (the SDK's cycle check walks the
graph per edge). tests/test_builds_program.py checks the transitive guarantee on the whole graph;
this checks the gate itself: where it is, what it holds, what it waits for, and that it is a real,
valid object with no credential in it. Projects, entities and namespaces come from the stack files."""
from __future__ import annotations

import json

from cloudstation_tools import checks, validate
from components import k8s as kb
from components.project_environment import IMAGES_KEY, images_config_map, images_data
from infra import delivery
from tests.builds_program import ENTITY_BUILD, STATEFUL_SERVICE
from tests import stacks

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
DOCKER_IMAGE = "docker:index/image:Image"


def gates(rendered) -> dict[str, object]:
    return {r.inputs["metadata"]["name"]: r for r in rendered.of_type(CONFIG_MAP)
            if r.inputs["metadata"]["name"].endswith("-images")}


def built(rendered, build_type: str) -> dict[str, set[str]]:
    """project -> URNs of its builds, read from each build's own inputs (its image repository)."""
    found: dict[str, set[str]] = {}
    for build in rendered.of_type(build_type):
        repository = build.inputs["repository"] if build_type == ENTITY_BUILD else build.inputs["imageName"].split("/", 1)[1]
        found.setdefault(repository.split("/")[0], set()).add(build.urn)
    return found


def check_gates(rendered, build_type: str) -> None:
    config = stacks.validate_config(rendered.stack)
    by_project = built(rendered, build_type)
    assert by_project, build_type
    every_build = set().union(*by_project.values())
    found = gates(rendered)
    assert set(found) == {images_config_map(project) for project in by_project}
    images = rendered.outputs["images"]
    for project, builds in by_project.items():
        gate = found[images_config_map(project)]
        # In the project's namespace, beside its StatefulServices; the images they deploy, in order.
        services = [s for s in rendered.of_type(STATEFUL_SERVICE)
                    if any(s.inputs["metadata"]["name"] == (e.name if project == delivery.PLATFORM_PROJECT else f"{project}-{e.name}")
                           for p, e in delivery.all_entities(config) if p == project)]
        assert services and {s.inputs["metadata"]["namespace"] for s in services} == {gate.inputs["metadata"]["namespace"]}
        refs = [images[f"{p}/{e.name}"] for p, e in delivery.all_entities(config) if p == project]
        assert gate.inputs["data"] == images_data(refs) == {IMAGES_KEY: "".join(f"{ref}\n" for ref in refs)}
        assert gate.inputs["metadata"]["labels"] == kb.labels(images_config_map(project), "cloudstate-entity")
        # It waits for every build of its project and for none of another's; every StatefulService waits for it.
        assert builds <= set(gate.dependencies) and not (set(gate.dependencies) & every_build) - builds, project
        for service in services:
            assert gate.urn in service.dependencies, service.name
    manifests = [o for o in rendered.manifests() if o["kind"] == "ConfigMap" and o["metadata"]["name"] in found]
    assert len(manifests) == len(found)
    assert validate.validate_all(manifests) == []
    for manifest in manifests:
        assert checks.configmap_violations(manifest["metadata"]["name"], manifest) == []
        assert "[secret]" not in json.dumps(manifest)  # the render redacts secret-derived values


def test_each_project_that_builds_has_one_gate_listing_its_images(rendered_stacks):
    check_gates(rendered_stacks["test"], ENTITY_BUILD)


def test_local_builds_are_gated_the_same_way():
    stack_file = stacks.read("test")
    platform = json.loads(stack_file.values["cloudstation:platform"])
    stack_file.values["cloudstation:platform"] = json.dumps({**platform, "builds": {"mode": "local"}})
    check_gates(stacks.render("test", stack_file), DOCKER_IMAGE)


def test_prod_builds_nothing_and_has_no_gate(rendered_stacks):
    assert gates(rendered_stacks["prod"]) == {}


def test_the_gate_names_no_entity_so_no_entity_name_looks_like_a_credential():
    """One key of references, not a key per entity: an entity named `token` or `password-reset`
    would otherwise be a credential-named key that the ConfigMap checks (and the policy pack) refuse."""
    refs = ["registry.example.com:5000/secrets/token:0a1b@sha256:" + "c" * 64,
            "localhost:32000/shop/password-reset:0a1b@sha256:" + "d" * 64]
    assert checks.configmap_violations("gate", {"data": images_data(refs)}) == []
    assert checks.configmap_violations("keyed", {"data": {"shop-token": refs[0]}}) != []  # what a key per entity risks
