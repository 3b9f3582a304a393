"""The stack config model: defaults, and one clear message listing every problem of a bad config."""
from __future__ import annotations

import json
import runpy

import pulumi
import pytest

from infra import config
from cloudstation_tools.render import ROOT, StackFile
from tests import stacks

# In the stack's registry (the default managed one) at the entity's repository (infra/image_refs.py).
PROD_REF = "localhost:32000/shop/cart@sha256:" + "a" * 64


def raw(environment="test", projects=None, **sections) -> dict[str, str]:
    projects = projects if projects is not None else [
        {"name": "shop", "entities": [
            {"name": "cart", "kind": "event-sourced", "language": "javascript", "source": "entities/shop/cart"},
        ]}
    ]
    values = {"cloudstation:environment": environment, "cloudstation:projects": json.dumps(projects)}
    if environment == "test" and "platform" not in sections:
        # A test stack building in the cluster (the default mode) must say where builds may pull from.
        sections = {**sections, "platform": {"builds": {"publicEgress": {"enabled": True}}}}
    values.update({f"cloudstation:{k}": json.dumps(v) for k, v in sections.items()})
    return values


def problems_of(values: dict, root=None) -> list[str]:
    with pytest.raises(config.ConfigError) as caught:
        config.load(values, root=root)
    return caught.value.problems


def test_both_stack_files_are_valid():
    for stack in ("test", "prod"):
        loaded = stacks.load(stacks.read(stack).values)  # prod: as promoted
        assert loaded.environment.value == stack
        assert {e.kind for p in loaded.projects for e in p.entities} == set(config.EntityKind)


def test_defaults_live_in_the_model():
    loaded = config.load(raw())
    assert loaded.platform.namespace == "cloudstation"
    assert loaded.platform.project_state.source == "entities/project-state"
    assert loaded.projects[0].entities[0].replicas == 1
    assert loaded.kubernetes.context is None


def test_typo_in_a_key_names_the_key_and_suggests_the_right_one():
    [problem] = problems_of(raw(platform={"namespcae": "x"}))
    assert problem.startswith("cloudstation:platform.namespcae: unknown key — allowed keys: ")
    assert "did you mean 'namespace'?" in problem


def test_typo_in_a_top_level_key():
    values = raw()
    values["cloudstation:platfrom"] = "{}"
    [problem] = problems_of(values)
    assert problem.startswith("cloudstation:platfrom: unknown key")
    assert "did you mean 'platform'?" in problem


def test_keys_of_other_namespaces_are_left_to_their_providers():
    values = raw()
    values["aws:region"] = "eu-west-1"
    assert config.load(values).environment is config.Environment.TEST
    # Kubernetes provider keys would be ignored (the program's provider is explicit): refused.
    values["kubernetes:context"] = "kind-kind"
    [problem] = problems_of(values)
    assert problem.startswith("kubernetes:context: not read") and "cloudstation:kubernetes.context" in problem


def test_wrong_type():
    projects = [{"name": "shop", "entities": [
        {"name": "cart", "kind": "action", "language": "javascript", "source": "s", "replicas": "two"}]}]
    [problem] = problems_of(raw(projects=projects))
    assert problem.startswith("cloudstation:projects[0].entities[0].replicas: 'two' — input should be a valid integer")


def test_unknown_entity_kind_lists_the_kinds():
    projects = [{"name": "shop", "entities": [
        {"name": "cart", "kind": "evented", "language": "javascript", "source": "s"}]}]
    [problem] = problems_of(raw(projects=projects))
    assert problem == (
        "cloudstation:projects[0].entities[0].kind: 'evented' — must be one of "
        "'event-sourced', 'replicated' or 'action'"
    )


def test_duplicate_entity_name():
    entity = {"name": "cart", "kind": "action", "language": "javascript", "source": "s"}
    [problem] = problems_of(raw(projects=[{"name": "shop", "entities": [entity, dict(entity)]}]))
    assert problem.startswith("cloudstation:projects[0].entities[1].name: 'cart' — entity names must be unique")


def test_project_name_must_be_a_dns_label():
    entity = {"name": "cart", "kind": "action", "language": "javascript", "source": "s"}
    [problem] = problems_of(raw(projects=[{"name": "My_Shop", "entities": [entity]}]))
    assert problem.startswith("cloudstation:projects[0].name: 'My_Shop' — must be a DNS label")


def test_prod_entity_needs_a_digest_pinned_image():
    entity = {"name": "cart", "kind": "action", "language": "javascript", "source": "s"}
    tagged = dict(entity, name="likes", image="registry.example:5000/shop/likes:1.0")
    problems = problems_of(raw("prod", projects=[{"name": "shop", "entities": [entity, tagged]}]))
    assert len(problems) == 3, problems
    assert problems[1].startswith(
        "cloudstation:projects[0].entities[0].image: (not set) — a prod entity needs a digest-pinned image"
    )
    assert problems[2].startswith(
        "cloudstation:projects[0].entities[1].image: 'registry.example:5000/shop/likes:1.0' — must be pinned by digest"
    )
    # the platform's own entity is held to the same rule
    assert problems[0].startswith("cloudstation:platform.projectState.image: (not set)")


def test_prod_with_digests_is_valid():
    entity = {"name": "cart", "kind": "action", "language": "javascript", "source": "s", "image": PROD_REF}
    loaded = config.load(raw("prod", projects=[{"name": "shop", "entities": [entity]}],
                             platform={"projectState": {"image": PROD_REF.replace("shop/cart", "platform/project-state")}}))
    assert loaded.projects[0].entities[0].image == PROD_REF


def test_test_entity_source_directory_must_exist(tmp_path):
    (tmp_path / "entities" / "project-state").mkdir(parents=True)
    [problem] = problems_of(raw(), root=tmp_path)
    assert problem.startswith("cloudstation:projects[0].entities[0].source: 'entities/shop/cart' — directory not found")


def test_every_problem_is_reported_at_once():
    projects = [{"name": "Shop", "entities": [{"name": "cart", "kind": "evented", "language": "cobol", "source": "s"}]}]
    values = raw("staging", projects=projects, kubernetes={"contxt": "x"})
    problems = problems_of(values)
    assert len(problems) == 5, problems
    message = str(config.ConfigError(problems, "Pulumi.test.yaml"))
    assert message.startswith("Pulumi.test.yaml has 5 problems:\n")


def test_bad_config_stops_the_program_before_any_resource(mocked):
    pulumi.runtime.set_all_config(raw(projects=[]))

    @pulumi.runtime.test
    def run():
        runpy.run_path(str(ROOT), run_name="__main__")  # ./__main__.py, as the engine runs it

    with pytest.raises(pulumi.RunError, match=r"cloudstation:projects: \[\] — list should have at least 1 item"):
        run()
    assert mocked.registrations == []
