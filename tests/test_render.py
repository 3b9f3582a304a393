"""`python -m infra render`: the real program per stack file, offline, written as reviewable files."""
from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from cloudstation_tools import render, render_output
from cloudstation_tools.mocks import MOCK_DIGEST_PREFIX, ProgramMocks, fake_digest
from cloudstation_tools.render import ROOT, KIND_ORDER
from tests import stacks
from tests.stacks import OWN_CLUSTER


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_render_command_writes_manifests_resources_and_outputs(tmp_path, rendered_stacks, fixture_project):
    result = run_cli("render", "--stack", "test", "--out", str(tmp_path), cwd=fixture_project)
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
    again = stacks.render("test")
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
        kept = rendered.of_type("pulumi-python:dynamic/secrets:KeptSecret")
        assert kept
        for registration in kept:
            for value in ProgramMocks().new_resource(_args(registration))[1]["values"]["value"].values():
                assert value.strip() not in text


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
        # Relative to the program's directory, the root (tests/test_engine_paths.py).
        ({"renderYamlToDirectory": "rendered/test"}, "renderYamlToDirectory", "rendered/test"),
    ]:
        stack_file = stacks.read("test")
        stack_file.values["cloudstation:kubernetes"] = json.dumps(kubernetes)
        rendered = stacks.render("test", stack_file=stack_file)
        [provider] = rendered.of_type("pulumi:providers:kubernetes")
        assert provider.inputs[key] == expected


def test_bad_config_exits_non_zero_with_the_message_and_writes_nothing(tmp_path):
    project = tmp_path / "project"
    for part in ("infra", "cloudstation_tools", "components", "entities", "tests/stacks/entities"):
        shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
    shutil.copy(ROOT / "Pulumi.yaml", project)
    document = yaml.safe_load((stacks.DIR / "Pulumi.test.yaml").read_text())
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


def test_unknown_stack_is_a_clear_error(tmp_path, fixture_project):
    result = run_cli("render", "--stack", "staging", "--out", str(tmp_path / "out"), cwd=fixture_project)
    assert result.returncode == 2
    assert "no stack file Pulumi.staging.yaml" in result.stderr


def test_project_file_names_the_program_and_the_config_namespace():
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == render.stack_config.PROJECT
    assert project["runtime"]["name"] == "python"
    program, entry = render.engine_paths.program_entry(ROOT)
    assert (program / entry / "__main__.py").is_file()


def test_port_forwards_name_what_pulumi_up_reaches_through_localhost(fixture_project):
    from cloudstation_tools.cli import port_forwards

    # test builds in Armada: the builds reach the registry through their own tunnel via the
    # Kubernetes API (infra/builds.py tunnels_to_registry), so only Armada's REST API is forwarded
    assert port_forwards(stacks.validate_config("test")) == [
        "armada armada-server 8080:8080",
    ]
    # prod pushes nothing (shared registry) and runs no Armada (one per cluster: test's)
    assert port_forwards(stacks.validate_config("prod")) == []
    # prod on its own cluster: an external registry, and the queue API at a public URL
    assert port_forwards(stacks.config(OWN_CLUSTER)) == []
    result = run_cli("port-forwards", "--stack", "test", cwd=fixture_project)
    assert result.returncode == 0 and result.stdout.splitlines() == ["armada armada-server 8080:8080"]
    # Rendering to a directory names no kube context, so no tunnel (it would go to the current
    # context's cluster, and the registry's credentials with it): the registry is forwarded again.
    values = dict(stacks.read("test").values)
    values["cloudstation:kubernetes"] = json.dumps({"renderYamlToDirectory": "rendered/test"})
    rendering = render.stack_config.load(values)
    assert port_forwards(rendering) == [
        f"{rendering.platform.namespace} registry {rendering.platform.registry.node_port}:5000",
        "armada armada-server 8080:8080",
    ]


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



# --- manifests.yaml for a reviewer: block scalars, the component of each object, mock values ------------

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def documents(text: str) -> list[tuple[list[str], dict]]:
    """(comment lines, object) of every document of a manifests.yaml, in order (the header first
    is not a document: it holds comments only)."""
    header, *chunks = re.split(r"(?m)^---\n", text)  # each chunk keeps its final line break
    assert yaml.safe_load(header) is None and all(line.startswith("#") for line in header.splitlines())
    result = []
    for chunk in chunks:
        lines = chunk.splitlines()
        comments = list(itertools.takewhile(lambda line: line.startswith("#"), lines))
        result.append((comments, yaml.load(chunk, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))))
    return result


def object_key(obj: dict) -> tuple:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]


def written(rendered, tmp_path: Path) -> str:
    out = tmp_path / rendered.stack
    render.write(rendered, out)
    return (out / "manifests.yaml").read_text(encoding="utf-8")


def test_every_object_is_under_the_urn_of_the_component_that_made_it(rendered, tmp_path):
    """`# from <parent URN>` above each document; the object itself is exactly the registered inputs
    (no annotation added), so it still validates as before."""
    registrations = {}
    for registration in rendered.registrations:
        if render_output.is_object(registration):
            key = object_key(render.canonical(render.clean(registration.inputs)))
            assert key not in registrations, key
            registrations[key] = registration
    components = {r.urn for r in rendered.registrations if not r.custom}
    docs = documents(written(rendered, tmp_path))
    assert [obj for _, obj in docs] == rendered.manifests()
    assert len(docs) == len(registrations)
    for comments, obj in docs:
        registration = registrations[object_key(obj)]
        assert comments[0] == f"# from {registration.parent}"
        assert registration.parent in components or is_stack(registration.parent)
        assert obj == render.canonical(render.clean(registration.inputs))
        assert "urn:pulumi:" not in json.dumps((obj["metadata"].get("annotations") or {})), "no URN annotation"


def blockable(text: str) -> bool:
    """Whether YAML can hold `text` as a literal block scalar: printable, no space before a line break
    or at the end (libyaml and PyYAML's emitters fall back to a quoted scalar otherwise)."""
    return all(ch == "\n" or ch.isprintable() for ch in text) and " \n" not in text and not text.endswith(" ")


def test_multi_line_strings_are_block_scalars(rendered, tmp_path):
    events = list(yaml.parse(written(rendered, tmp_path)))
    multi_line = [e for e in events if isinstance(e, yaml.ScalarEvent) and "\n" in e.value]
    expected = sum(1 for obj in rendered.manifests() for value in leaves(obj) if isinstance(value, str) and "\n" in value)
    assert len(multi_line) == expected > 0
    assert [e.value[:60] for e in multi_line if blockable(e.value) and e.style != "|"] == []
    assert [e.value[:60] for e in multi_line if not blockable(e.value) and e.style != '"'] == []


def leaves(value):
    if isinstance(value, dict):
        for key, child in value.items():
            yield key
            yield from leaves(child)
    elif isinstance(value, list):
        for child in value:
            yield from leaves(child)
    else:
        yield value


def test_block_scalars_keep_every_string_exactly():
    """Trailing newlines (|, |-, |+), leading spaces, and strings YAML cannot hold as a block."""
    strings = ["a\nb", "a\nb\n", "a\nb\n\n", "  indented\nfirst line\n", "trailing space \nx", "tab\there\nx", "\nlead"]
    text = render_output.dump({"data": {str(i): s for i, s in enumerate(strings)}})
    assert yaml.safe_load(text) == {"data": {str(i): s for i, s in enumerate(strings)}}
    assert "'0': |-\n    a\n    b\n" in text


def test_manifests_are_the_same_bytes_with_or_without_libyaml(rendered):
    """Output does not depend on which emitter the machine has (libyaml is used when present)."""
    pairs = render_output.objects(rendered.registrations)
    pure = render_output.manifests_yaml(rendered.stack, pairs, rendered.made_up, rendered.reads, render_output.PureDumper)
    assert rendered.manifests_yaml() == pure


def test_mock_digests_are_recognisable_and_marked(rendered, tmp_path):
    """Every digest the docker mock makes starts with MOCK_DIGEST_PREFIX and is listed in the header;
    each object holding one says where under `# mock:`; a real, pinned digest (platform images,
    infra/image-digests.yaml) is never marked. Prod's promoted references carry test's mock digests
    (tests/stacks/): marked too, though its own mocks made none."""
    text = written(rendered, tmp_path)
    header = re.split(r"(?m)^---\n", text, maxsplit=1)[0]
    builds = rendered.of_type("docker:index/image:Image") + rendered.of_type("pulumi-python:dynamic/builds:EntityBuild")
    assert len(rendered.made_up) == len(builds)
    for digest in rendered.made_up:
        assert digest.startswith(MOCK_DIGEST_PREFIX) and DIGEST.fullmatch(digest)
        assert digest in header
    pinned = set(DIGEST.findall((ROOT / "infra" / "image-digests.yaml").read_text()))
    assert pinned and not any(d.startswith(MOCK_DIGEST_PREFIX) for d in pinned)
    marked_objects = 0
    real_seen = set()
    for comments, obj in documents(text):
        found = DIGEST.findall(json.dumps(obj))
        mock = {d for d in found if d.startswith(MOCK_DIGEST_PREFIX)}
        real_seen |= set(found) - mock
        mock_lines = [c for c in comments if c.startswith("# mock:") and "digest" in c]  # not reads
        named = {d for line in mock_lines for d in DIGEST.findall(line)}
        for digest in mock & set(rendered.made_up):
            assert any(rendered.made_up[digest] in line for line in mock_lines), (obj["metadata"], digest)
        assert named <= mock, "a real digest is never called a mock"
        assert bool(mock_lines) == bool(mock), obj["metadata"]
        marked_objects += bool(mock)
    assert real_seen & pinned, "the platform's real pins are in the manifests, unmarked"
    # Every entity's StatefulService runs a built (test) or promoted (prod) image: all mock digests here.
    projects = json.loads(stacks.read(rendered.stack).values["cloudstation:projects"])
    assert marked_objects >= sum(len(project["entities"]) for project in projects) > 0


def test_objects_read_at_up_are_marked():
    """`Secret.get` of an existing Secret is a read (ReadResource); the mock makes its data up, so
    the header lists it and every object that uses it says so."""
    from tests import stacks

    rendered = stacks.rendered("non-owner")  # external PostgreSQL: credentials from ops/pg-login
    reads = {urn: what for urn, what in rendered.reads.items()}
    assert list(reads.values()) == ["kubernetes:core/v1:Secret ops/pg-login"]
    assert not any(r.urn in reads for r in rendered.registrations), "a read is not a registration"
    users = [r for r in rendered.registrations if render_output.is_object(r) and set(r.dependencies) & reads.keys()]
    assert users
    text = rendered.manifests_yaml()
    header = re.split(r"(?m)^---\n", text, maxsplit=1)[0]
    assert all(urn in header for urn in reads)
    marked = [obj for comments, obj in documents(text)
              if any(c.startswith("# mock: uses kubernetes:core/v1:Secret ops/pg-login") for c in comments)]
    assert sorted(map(object_key, marked)) == sorted(object_key(render.canonical(render.clean(r.inputs))) for r in users)


def test_fake_digests_are_valid_and_distinct():
    from infra.image_refs import is_digest_ref

    digests = {fake_digest("a"), fake_digest("b"), fake_digest("a", "b")}
    assert len(digests) == 3
    for digest in digests:
        assert digest.startswith(MOCK_DIGEST_PREFIX) and DIGEST.fullmatch(digest)
        assert is_digest_ref(f"localhost:32000/shop/cart:tag@{digest}")


# --- render cost: what the command loads ---------------------------------------------------------------

NEVER_LOADED = ("boto3", "botocore", "ruamel", "kubernetes_validate", "jsonschema", "moto", "requests")
"""Modules of the promotion, validation and test tooling that `python -m infra render` has no use for."""

_LOADED_BY_RENDER = """
import json, sys
before = set(sys.modules)
sys.path.insert(0, sys.argv[1])
from cloudstation_tools import cli, render  # what `python -m infra render` imports first
stack = json.loads(sys.stdin.read())
render.render(stack["name"], stack_file=render.StackFile(stack["values"], stack["secret_keys"]),
              stack_dir=__import__("pathlib").Path(sys.argv[2]))
print(json.dumps(sorted({name.split(".")[0] for name in set(sys.modules) - before})))
"""


def loaded_by_render(stack: str) -> set[str]:
    """Top-level packages a fresh interpreter loads to import the command and render `stack`."""
    stack_file = stacks.read(stack)
    result = subprocess.run(
        [sys.executable, "-c", _LOADED_BY_RENDER, str(ROOT), str(stacks.DIR)],
        input=json.dumps({"name": stack, "values": stack_file.values, "secret_keys": stack_file.secret_keys}),
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_render_loads_only_what_the_stack_uses():
    """pulumi_docker is loaded only by a stack that builds images (components/entity_image.py imports
    it when an EntityImage is made); nothing of promotion (ruamel, boto3), validation
    (kubernetes_validate, jsonschema) or the tests is ever loaded."""
    test, prod = loaded_by_render("test"), loaded_by_render("prod")
    assert "pulumi_kubernetes" in test and "pulumi_kubernetes" in prod
    # builds its entities' images, with Docker only in `local` mode (infra/builds.py: in the cluster otherwise)
    assert ("pulumi_docker" in test) == (stacks.validate_config("test").platform.build_mode == "local")
    assert "pulumi_docker" not in prod  # deploys promoted references only
    assert not (test | prod) & set(NEVER_LOADED)


def test_render_gives_the_collector_back():
    """The program turns the cyclic GC off for its batch (infra/program.py main); render, which runs it
    inside a longer process (these tests), turns it back on, or the session's garbage would pile up."""
    import gc

    assert gc.isenabled()
    stacks.render("test")
    assert gc.isenabled()
