"""What a version bump does on `pulumi up`, which mocks skip (cloudstation_tools/engine.py): each pin of
infra/versions.py is changed in turn, the stack rendered again and compared with the current render
URN by URN, as the engine diffs state. No change may update an immutable field in place (the API
server rejects it and the up fails half-way), and a replacement under an unchanged name must
delete first (a create of the same name fails). Run on both stack files and on prod with a cluster
of its own; a pin that no checked stack deploys is still rendered, and must change nothing there."""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable

import pytest

from components.entity_image import GENERATED_LANGUAGES, generated_dockerfile
from infra import delivery, versions
from cloudstation_tools import engine, render
from tests import armada_variants, promoted

STACKS = ["test", "prod", armada_variants.OWN_CLUSTER]
VERSION_CONSTANTS = ("ARMADA", "CLOUDSTATE_OPERATOR", "CLOUDSTATE_PROXY")
"""Versions that several IMAGES entries share: bumped together, as a release bumps them."""


def pin_groups() -> dict[str, list[str]]:
    """IMAGES keys that change together: those sharing a version constant's tag, else each alone."""
    groups: dict[str, list[str]] = {}
    for key, ref in versions.IMAGES.items():
        tag = ref.rsplit(":", 1)[1]
        shared = [name for name in VERSION_CONSTANTS if getattr(versions, name) == tag]
        groups.setdefault(shared[0] if shared else key, []).append(key)
    return groups


GROUPS = pin_groups()


def bumped(ref: str) -> str:
    return f"{ref}-bumped"


def render_stack(stack: str) -> render.Rendered:
    if stack in armada_variants.ARMADA_STACKS and stack != "test":
        return render.render("prod", stack_file=armada_variants.stack_file(stack))
    return render.render(stack, stack_file=promoted.read(stack))  # prod: as promoted (tests/promoted.py)


BUMPED: dict = {}
"""(stack, pin groups) -> render, shared with tests/test_upgrades.py (one render per bump per session)."""
STACK_RENDERERS: dict[str, Callable[[str], render.Rendered]] = {}
"""Renderers of stacks other than the stack files and Armada variants (tests/test_upgrades.py adds its own)."""


def render_bumped(stack: str, groups: tuple[str, ...]) -> render.Rendered:
    """The stack rendered with those pin groups bumped (about 1 s of CPU per render), cached."""
    if (stack, groups) not in BUMPED:
        with pytest.MonkeyPatch.context() as patch:
            for group in groups:
                for key in GROUPS[group]:
                    patch.setitem(versions.IMAGES, key, bumped(versions.IMAGES[key]))
                if group in VERSION_CONSTANTS:
                    patch.setattr(versions, group, bumped(getattr(versions, group)))
            BUMPED[(stack, groups)] = STACK_RENDERERS.get(stack, render_stack)(stack)
    return BUMPED[(stack, groups)]


@pytest.fixture(scope="module")
def renders(rendered_stacks):
    """Lazily: (stack, pin groups) -> the stack rendered with those groups bumped; () is the
    current render. Each group a stack deploys is rendered alone."""

    def get(stack: str, groups: tuple[str, ...] = ()) -> render.Rendered:
        if not groups:
            if stack in STACK_RENDERERS:
                return STACK_RENDERERS[stack](stack)
            return rendered_stacks.get(stack) or armada_variants.variant(stack)
        return render_bumped(stack, groups)

    return get


def _graph(rendered: render.Rendered) -> engine.Graph:
    return engine.Graph(rendered.resources())


def scanned(resources: list[dict]) -> list[dict]:
    """Resources without an in-cluster build's `dockerfileText`: an entity's own Dockerfile is its
    source (its FROM lines are the entity's choice, like its code), not a pin of infra/versions.py."""
    return [{**r, "inputs": {k: v for k, v in r["inputs"].items() if k != "dockerfileText"}}
            if r["type"] == "pulumi-python:dynamic/builds:EntityBuild" else r for r in resources]


def deployed(rendered: render.Rendered) -> list[str]:
    """The pin groups whose references occur in a render (mirrored or not)."""
    text = json.dumps(scanned(rendered.resources()))
    # An entity without a Dockerfile is built from one the program generates (infra/delivery.py
    # `entity_dockerfile`): its base images reach the stack only through the image's content tag.
    # (Every language's: a base image that no entity of the stack uses then changes nothing.)
    for image in rendered.of_type("docker:index/image:Image"):
        if delivery.GENERATED_DIR.as_posix() in image.inputs["build"]["dockerfile"]:
            text += "".join(generated_dockerfile(language, delivery.base_images(None)) for language in GENERATED_LANGUAGES)
    return [g for g, keys in GROUPS.items() if any(_repository_tag(versions.IMAGES[k]) in text for k in keys)]


def _repository_tag(ref: str) -> str:
    """`library/postgres:16.6-alpine3.21`: the part a mirror (platform.imageMirror) keeps."""
    return ref.split("/", 1)[1]


@pytest.mark.parametrize("stack", STACKS)
def test_a_version_bump_updates_in_place_only_what_may_change_and_replaces_safely(renders, stack):
    before = _graph(renders(stack))
    groups = deployed(renders(stack))
    assert groups, "the stack deploys no pinned image"
    problems = []
    for group in groups:
        after = _graph(renders(stack, (group,)))
        assert {r.urn for r in before.resources} == {r.urn for r in after.resources}, group
        problems += [f"{group}: {p}" for change in engine.changes(before, after) for p in change.problems()]
    assert problems == []


@pytest.mark.parametrize("stack", STACKS)
def test_pins_a_stack_does_not_deploy_change_nothing_in_it(renders, stack):
    """The rest, bumped at once: not even through a derived value (an image tag hashed from a
    Dockerfile that names a base image) may they reach the stack unchecked."""
    absent = tuple(g for g in GROUPS if g not in deployed(renders(stack)))
    if absent:
        assert engine.changes(_graph(renders(stack)), _graph(renders(stack, absent))) == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_pin_a_stack_deploys_reaches_it_only_through_infra_versions(renders, stack):
    """Guards the test above: a group's render bumps every reference of its pins in the graph
    (nothing copies a version elsewhere)."""
    for group in deployed(renders(stack)):
        text = json.dumps(scanned(renders(stack, (group,)).resources()))
        for key in GROUPS[group]:
            old = re.escape(_repository_tag(versions.IMAGES[key]))
            assert not re.search(old + r"(?!-bumped)", text), (group, key)


def test_bumps_replace_only_what_cannot_roll_in_place(renders):
    """What the model says a bump does, spelled out for the test stack: images of long-running
    workloads roll in place; a Job's pod template is immutable, so the provider replaces it, and
    deletes the old Job first because its name stays (provider.go Diff)."""
    jobs = 0
    for group in deployed(renders("test")):
        for change in engine.changes(_graph(renders("test")), _graph(renders("test", (group,)))):
            if change.new.kind in ("Deployment", "StatefulSet", "DaemonSet", "CronJob"):
                assert not change.replaced, change.new.label()
            if change.new.kind == "Job":
                jobs += 1
                assert change.replaced and change.delete_before_replace(True), change.new.label()
    assert jobs


# --- the model on objects made for the purpose: each check fails when its fault is present ---------


def _object(kind: str, api: str, name: str = "x", options=None, **body) -> engine.Resource:
    metadata = {"name": name, "namespace": "ns"}
    return engine.Resource(f"urn:pulumi:s::p::{kind}::{name}", f"kubernetes:{api}:{kind}", name, True, (),
                           dict(options or {}), {"apiVersion": api.replace("core/", ""), "kind": kind,
                                                 "metadata": metadata, **body})


def _changed(old: engine.Resource, provider_config=None, options=None, **body) -> engine.Change:
    new = dataclasses.replace(old, inputs={**old.inputs, **body}, options=dict(options or old.options))
    change = engine.diff(old, new, provider_config or {})
    assert change is not None
    return change


def _sts(**spec) -> engine.Resource:
    base = {"serviceName": "db", "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}]}
    return _object("StatefulSet", "apps/v1", spec={**base, **spec})


def test_a_statefulset_rolls_its_template_in_place_and_replaces_for_its_claims():
    sts = _sts()
    image = _changed(sts, spec={**sts.spec, "template": {**sts.spec["template"], "spec": {"containers": [{"name": "c", "image": "i:2"}]}}})
    assert not image.replaced and image.problems() == []
    claims = _changed(sts, spec={**sts.spec, "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}]})
    assert claims.replaced and claims.delete_before_replace(True) and claims.problems() == []
    # The program overriding the provider's delete-before-replace: the new object's create collides.
    forced = _changed(sts, options={"deleteBeforeReplace": False},
                      spec={**sts.spec, "volumeClaimTemplates": []})
    assert any("collides" in p for p in forced.problems())


def test_an_immutable_field_outside_the_force_new_list_fails_in_place():
    claim = _object("PersistentVolumeClaim", "core/v1", spec={"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"})
    change = _changed(claim, spec={"accessModes": ["ReadWriteOnce"], "volumeMode": "Block"})
    assert not change.replaced and any("in-place update of immutable spec.volumeMode" in p for p in change.problems())
    # replaceOnChanges from the program turns it into a replacement, which must then delete first.
    undeleted = _changed(claim, options={"replaceOnChanges": ["spec.volumeMode"]},
                         spec={"accessModes": ["ReadWriteOnce"], "volumeMode": "Block"})
    assert undeleted.replaced and any("set deleteBeforeReplace=True" in p for p in undeleted.problems())
    deleting = _changed(claim, options={"replaceOnChanges": ["spec.volumeMode"], "deleteBeforeReplace": True},
                        spec={"accessModes": ["ReadWriteOnce"], "volumeMode": "Block"})
    assert deleting.problems() == []
    priority = _object("PriorityClass", "scheduling.k8s.io/v1", value=10)
    assert any("immutable value" in p for p in _changed(priority, value=20).problems())


def test_a_new_name_replaces_without_deleting_first():
    job = _object("Job", "batch/v1", spec={"template": {"spec": {"containers": [{"name": "c", "image": "i:1"}]}}})
    renamed = _changed(job, metadata={"name": "x-2", "namespace": "ns"},
                       spec={"template": {"spec": {"containers": [{"name": "c", "image": "i:2"}]}}})
    assert renamed.replaced and not renamed.same_name and renamed.problems() == []


def test_ignore_changes_and_mutable_config_follow_the_program_and_provider():
    config = _object("ConfigMap", "core/v1", data={"a": "1"})
    assert _changed(config, data={"a": "2"}).replaced
    assert not _changed(config, provider_config={"enableConfigMapMutable": "true"}, data={"a": "2"}).replaced
    assert engine.diff(config, dataclasses.replace(config, inputs={**config.inputs, "data": {"a": "2"}},
                                                   options={"ignoreChanges": ["data"]})) is None
    secret = _object("Secret", "core/v1", type="Opaque", stringData={"k": "v"})
    assert _changed(secret, provider_config={"enableSecretMutable": "true"}, stringData={"k": "w"}).replaced is False
    assert _changed(secret, provider_config={"enableSecretMutable": "true"}, immutable=True, stringData={"k": "w"}).replaced


def test_property_paths_parse_as_the_engine_parses_them():
    assert engine.property_path('metadata.annotations["pulumi.com/skipAwait"]') == (
        "metadata", "annotations", "pulumi.com/skipAwait")
    assert engine.property_path("spec.template.spec.containers[0].image") == (
        "spec", "template", "spec", "containers", 0, "image")
    assert engine.property_path("spec.containers[*].image") == ("spec", "containers", "*", "image")
