"""`python -m infra render`: the real program per stack file, offline, written as reviewable files."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from infra import render
from infra.mocks import ProgramMocks
from infra.render import ROOT, KIND_ORDER, StackFile
from tests.armada_variants import OWN_CLUSTER, stack_file

from tests import promoted

def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_render_command_writes_manifests_resources_and_outputs(tmp_path, rendered_stacks):
    result = run_cli("render", "--stack", "test", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    manifests = [d for d in yaml.safe_load_all((tmp_path / "manifests.yaml").read_text()) if d]
    resources = json.loads((tmp_path / "resources.json").read_text())
    outputs = json.loads((tmp_path / "outputs.json").read_text())
    expected = rendered_stacks["test"]
    assert manifests == expected.manifests()
    assert len(resources) == len(expected.registrations)
    assert outputs == expected.outputs
    for obj in manifests:
        assert {"apiVersion", "kind", "metadata"} <= set(obj)
        assert list(obj)[:3] == ["apiVersion", "kind", "metadata"]


def test_render_is_deterministic(rendered_stacks, tmp_path):
    again = render.render("test")
    render.write(rendered_stacks["test"], tmp_path / "a")
    render.write(again, tmp_path / "b")
    for name in ("manifests.yaml", "resources.json", "outputs.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_manifests_are_in_apply_order(rendered):
    ranks = [render.apply_order(o)[0] for o in rendered.manifests()]
    assert ranks == sorted(ranks)
    kinds = [o["kind"] for o in rendered.manifests()]
    assert kinds[0] == "Namespace"
    custom = [i for i, o in enumerate(rendered.manifests()) if o["kind"] not in KIND_ORDER]
    definitions = [i for i, k in enumerate(kinds) if k == "CustomResourceDefinition"]
    assert not custom or not definitions or max(definitions) < min(custom)


def test_resources_json_lists_every_registration_with_parent_and_inputs(rendered):
    resources = rendered.resources()
    urns = {r["urn"] for r in resources}
    assert len(urns) == len(resources)
    components = {r["urn"] for r in resources if not r["custom"]}
    for resource in resources:
        assert resource["type"] and resource["name"]
        assert isinstance(resource["inputs"], dict)
        assert resource["parent"] in components or is_stack(resource["parent"]), resource["urn"]


def is_stack(urn: str) -> bool:
    return urn.split("::")[2] == "pulumi:pulumi:Stack"


def test_no_secret_value_is_written(rendered_stacks, tmp_path):
    """Generated passwords and `secure:` values appear nowhere in what render writes."""
    for stack, rendered in rendered_stacks.items():
        render.write(rendered, tmp_path / stack)
        text = "".join((tmp_path / stack / f).read_text() for f in ("manifests.yaml", "resources.json", "outputs.json"))
        assert "fake-secret-for-" not in text
        for registration in rendered.of_type("random:index/randomPassword:RandomPassword"):
            state = ProgramMocks().new_resource(_args(registration))[1]
            assert state["result"]["value"] not in text
            assert state["bcryptHash"]["value"] not in text


def _args(registration):
    from pulumi.runtime import MockResourceArgs

    return MockResourceArgs(registration.type, registration.name, registration.inputs)


def test_kubernetes_provider_is_explicit_and_used_by_every_object(rendered):
    [provider] = rendered.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["enableServerSideApply"] == "true"
    provider_ref = f"{provider.urn}::{provider.name}-id"
    objects = [r for r in rendered.registrations if r.custom and r.type.startswith("kubernetes:")]
    assert objects
    assert {r.provider for r in objects} == {provider_ref}


def test_render_yaml_to_directory_and_context_reach_the_provider():
    # Separately: pulumi-kubernetes rejects context with renderYamlToDirectory (infra/config.py).
    for kubernetes, key, expected in [
        ({"context": "kind-cloudstation"}, "context", "kind-cloudstation"),
        # Relative to the program's directory, infra/ (tests/test_engine_paths.py).
        ({"renderYamlToDirectory": "rendered/test"}, "renderYamlToDirectory", "../rendered/test"),
    ]:
        stack_file = StackFile.read("test")
        stack_file.values["cloudstation:kubernetes"] = json.dumps(kubernetes)
        rendered = render.render("test", stack_file=stack_file)
        [provider] = rendered.of_type("pulumi:providers:kubernetes")
        assert provider.inputs[key] == expected


def test_bad_config_exits_non_zero_with_the_message_and_writes_nothing(tmp_path):
    project = tmp_path / "project"
    for part in ("infra", "components", "entities"):
        shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
    shutil.copy(ROOT / "Pulumi.yaml", project)
    document = yaml.safe_load((ROOT / "Pulumi.test.yaml").read_text())
    document["config"]["cloudstation:projects"][0]["entities"][0]["kind"] = "evented"
    document["config"]["cloudstation:platform"]["namespcae"] = "x"
    (project / "Pulumi.broken.yaml").write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    result = run_cli("render", "--stack", "broken", "--out", str(out), cwd=project)
    assert result.returncode == 2
    assert "Pulumi.broken.yaml has 2 problems" in result.stderr
    assert "cloudstation:projects[0].entities[0].kind: 'evented' — must be one of" in result.stderr
    assert "cloudstation:platform.namespcae: unknown key" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_unknown_stack_is_a_clear_error(tmp_path):
    result = run_cli("render", "--stack", "staging", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "no stack file Pulumi.staging.yaml" in result.stderr


def test_project_file_names_the_program_and_the_config_namespace():
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == render.stack_config.PROJECT
    assert project["runtime"]["name"] == "python"
    assert (ROOT / project["main"] / "__main__.py").is_file()


def test_port_forwards_name_what_pulumi_up_reaches_through_localhost():
    from infra.cli import port_forwards

    assert port_forwards(render.validate_config("test")) == [
        "cloudstation registry 32000:5000",
        "armada armada-server 8080:8080",
    ]
    # prod pushes nothing (shared registry) and runs no Armada (one per cluster: test's)
    assert port_forwards(promoted.validate_config("prod")) == []
    # prod on its own cluster: an external registry, and the queue API at a public URL
    assert port_forwards(render.stack_config.load(stack_file(OWN_CLUSTER).values)) == []
    result = run_cli("port-forwards", "--stack", "test")
    assert result.returncode == 0 and result.stdout.splitlines()[0] == "cloudstation registry 32000:5000"


def test_resources_json_records_the_options_the_engine_acts_on(mocked, tmp_path):
    """protect, retainOnDelete, deleteBeforeReplace (either way: False overrides the provider's
    own delete-before-replace), ignoreChanges, replaceOnChanges and customTimeouts, as the
    RegisterResourceRequest carries them; unset options are left out."""
    import pulumi
    import pulumi_kubernetes as k8s

    from tests.conftest import run_mocked

    def make():
        k8s.core.v1.ConfigMap("plain", metadata={"name": "plain"}, data={"a": "b"})
        k8s.core.v1.ConfigMap(
            "guarded",
            metadata={"name": "guarded"},
            data={"a": "b"},
            opts=pulumi.ResourceOptions(
                protect=True, retain_on_delete=True, delete_before_replace=False, ignore_changes=["data"],
                replace_on_changes=["metadata.labels"], custom_timeouts=pulumi.CustomTimeouts(create="3m", delete="1m"),
            ),
        )
        k8s.core.v1.ConfigMap("replaced", metadata={"name": "replaced"}, opts=pulumi.ResourceOptions(delete_before_replace=True))

    run_mocked(make)
    rendered = render.Rendered("unit", sorted(mocked.registrations, key=lambda r: r.urn), {})
    render.write(rendered, tmp_path)
    written = {r["name"]: r for r in json.loads((tmp_path / "resources.json").read_text())}
    assert written["plain"]["options"] == {}
    assert written["guarded"]["options"] == {
        "protect": True, "retainOnDelete": True, "deleteBeforeReplace": False, "ignoreChanges": ["data"],
        "replaceOnChanges": ["metadata.labels"], "customTimeouts": {"create": "3m", "delete": "1m"},
    }
    assert written["replaced"]["options"] == {"deleteBeforeReplace": True}

