"""File-system path inputs resolve as the engine resolves them (infra/engine_paths.py).

The engine runs the program and starts every provider in the directory Pulumi.yaml's `main` names
(none: the project root), and providers open paths from there: every path input of every rendered
stack must be relative and name an existing path inside the repository from that directory,
whatever directory the tests (or a user's shell) run from. The check itself is also tested for a
program in a subdirectory (`SUBDIR`), where paths from the project root would be wrong.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from infra import config as stack_config
from infra import engine_paths
from infra.engine_paths import PATH_INPUTS, from_program, path_values, problems, program_dir, program_entry
from infra.program import provider_args
from cloudstation_tools.render import ROOT
from tests import stacks

PROGRAM_DIR = program_dir(ROOT)
SUBDIR = ROOT / "infra"
"""A program directory below the root, for the check's own tests (Pulumi.yaml once had `main: infra/`)."""
DOCKER_IMAGE = "docker:index/image:Image"


def resource(type_: str, inputs: dict, name: str = "r") -> SimpleNamespace:
    return SimpleNamespace(type=type_, name=name, inputs=inputs)


# --- where the engine runs the program --------------------------------------------------------


def test_the_program_runs_from_the_root_where_the_virtualenv_is_resolved_alike():
    """The language host resolves `virtualenv` against the project root (pulumi/pulumi sdk/v3
    python/toolchain pip.go resolveVirtualEnvironmentPath(root, virtualenv)); the engine starts
    the dynamic providers' launcher in the program directory (pkg/resource/plugin/provider_plugin.go
    newPlugin(ctx, ctx.Pwd, ...), plugin.go `cmd.Dir = pwd`) with PULUMI_RUNTIME_VIRTUALENV set to
    the raw option, which sdk/python/dist/pulumi-resource-pulumi-python makes absolute with $PWD.
    Both name the same directory only when the program directory is the root (pulumi/pulumi#7061:
    with `main: infra/` every queue and build failed at start-up, seen in the end-to-end tier)."""
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    virtualenv = project["runtime"]["options"]["virtualenv"]
    language_host = Path(os.path.normpath(ROOT / virtualenv))
    dynamic_providers = Path(os.path.normpath(PROGRAM_DIR / virtualenv))
    assert dynamic_providers == language_host
    assert program_entry(ROOT) == (ROOT, ".") and (ROOT / "__main__.py").is_file()


@pytest.mark.parametrize(
    "main, expected",
    [(None, (".", ".")), ("app/", ("app", ".")), ("app", ("app", ".")), ("app/run.py", ("app", "run.py"))],
)
def test_program_entry_follows_the_engines_getpwdmain(tmp_path, main, expected):
    (tmp_path / "app").mkdir()
    (tmp_path / "app/run.py").write_text("")
    (tmp_path / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "p", "runtime": "python", **({"main": main} if main else {})}))
    pwd, entry = program_entry(tmp_path)
    assert (pwd, entry) == (Path(os.path.normpath(tmp_path / expected[0])), expected[1])


@pytest.mark.parametrize("main, message", [("/abs", "must be a relative path"), ("../up", "must be a subfolder")])
def test_program_entry_rejects_what_the_engine_rejects(tmp_path, main, message):
    (tmp_path / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "p", "runtime": "python", "main": main}))
    with pytest.raises(ValueError, match=message):
        program_entry(tmp_path)


def test_from_program_is_relative_to_the_working_directory():
    assert from_program("entities/shop/cart", ROOT, ROOT / "infra") == "../entities/shop/cart"
    assert from_program(".cloudstation/dockerfiles/x.Dockerfile", ROOT, ROOT / "infra") == "../.cloudstation/dockerfiles/x.Dockerfile"
    assert from_program("entities/shop/cart", ROOT, ROOT) == "entities/shop/cart"
    with pytest.raises(ValueError):
        from_program("/etc", ROOT, ROOT)


# --- the check on every rendered stack --------------------------------------------------------


STACKS = ["test", "prod", stacks.OWN_CLUSTER]


@pytest.fixture(params=STACKS)
def any_rendered(request, rendered_stacks):
    if request.param in rendered_stacks:
        return rendered_stacks[request.param]
    return stacks.rendered(request.param)


def test_every_path_input_is_relative_and_resolves_from_the_program_directory(any_rendered):
    assert problems(any_rendered.registrations, PROGRAM_DIR, ROOT, os.environ.get("KUBECONFIG")) == []


def test_the_test_stack_checks_a_context_and_a_dockerfile_per_built_entity(rendered_stacks):
    """The check above is not vacuous: the test stack passes two path inputs per image."""
    rendered = rendered_stacks["test"]
    images = rendered.of_type(DOCKER_IMAGE)
    # In-cluster builds (builds.mode: armada) pass the context directory alone (the Dockerfile is text).
    builds = rendered.of_type("pulumi-python:dynamic/builds:EntityBuild")
    assert images or builds
    checked = [(r.name, entry.property) for r, entry, _ in path_values(rendered.registrations)]
    assert sorted(checked) == sorted([(r.name, p) for r in images for p in ("build.context", "build.dockerfile")]
                                     + [(r.name, "contextDir") for r in builds])
    config = stacks.validate_config("test")
    sources = {config.platform.project_state.source} | {e.source for p in config.projects for e in p.entities}
    contexts = [image.inputs["build"]["context"] for image in images] + [b.inputs["contextDir"] for b in builds]
    # As the stack file spells them: from the program directory, the root (not ../entities/...).
    assert contexts and set(contexts) == sources, (contexts, sources)


def test_render_yaml_to_directory_is_passed_relative_to_the_program_directory():
    stack_file = stacks.read("test")
    stack_file.values["cloudstation:kubernetes"] = json.dumps({"renderYamlToDirectory": "rendered/test"})
    rendered = stacks.render("test", stack_file=stack_file)
    [provider] = rendered.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["renderYamlToDirectory"] == "rendered/test"
    assert Path(os.path.normpath(PROGRAM_DIR / "rendered/test")) == ROOT / "rendered/test"
    assert problems(rendered.registrations, PROGRAM_DIR, ROOT) == []


def test_provider_args_follow_the_working_directory():
    kubernetes = stack_config.KubernetesConfig(render_yaml_to_directory="out/yaml")
    assert provider_args(kubernetes, ROOT, ROOT / "infra")["render_yaml_to_directory"] == "../out/yaml"
    assert provider_args(kubernetes, ROOT, ROOT)["render_yaml_to_directory"] == "out/yaml"


def test_render_from_another_directory_gives_identical_inputs_and_restores_the_cwd(tmp_path, monkeypatch, rendered_stacks):
    monkeypatch.chdir(tmp_path)
    again = stacks.render("test")
    assert Path.cwd() == tmp_path
    assert again.resources() == rendered_stacks["test"].resources()
    assert again.outputs == rendered_stacks["test"].outputs


def test_render_restores_the_cwd_when_the_program_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stack_file = stacks.read("test")
    stack_file.values["cloudstation:environment"] = "staging"
    with pytest.raises(stack_config.ConfigError):
        stacks.render("test", stack_file=stack_file)
    assert Path.cwd() == tmp_path


# --- the check finds what it should -----------------------------------------------------------


def docker_image(context: str, dockerfile: str) -> SimpleNamespace:
    return resource(DOCKER_IMAGE, {"build": {"context": context, "dockerfile": dockerfile}}, "img")


def test_the_check_flags_paths_relative_to_the_repository_root():
    """The original fault: inputs spelled from the repository root, resolved from infra/."""
    found = problems([docker_image("entities/shop/cart", "entities/shop/cart/Dockerfile")], SUBDIR, ROOT)
    assert len(found) == 2 and all("no " in p and "infra" in p for p in found), found


def test_the_check_flags_absolute_paths_and_paths_outside_the_repository(tmp_path):
    found = problems([docker_image(str(ROOT / "entities/shop/cart"), "../entities/shop/cart/Dockerfile")], SUBDIR, ROOT)
    assert len(found) == 1 and "absolute" in found[0]
    (tmp_path / "ctx").mkdir()
    outside = os.path.relpath(tmp_path / "ctx", SUBDIR)
    found = problems([docker_image(outside, "../entities/shop/cart/Dockerfile")], SUBDIR, ROOT)
    assert len(found) == 1 and "outside the repository" in found[0]


def test_the_check_flags_a_file_where_a_directory_is_expected():
    found = problems([docker_image("../entities/shop/cart/Dockerfile", "../entities/shop/cart")], SUBDIR, ROOT)
    assert len(found) == 2


@pytest.mark.parametrize(
    "directory, ok",
    [("../rendered/test", True), ("../../h1-no-such-parent/x/y", False), ("/tmp/rendered", False), ("..", True)],
)
def test_the_check_of_render_yaml_to_directory(directory, ok):
    provider = resource("pulumi:providers:kubernetes", {"renderYamlToDirectory": directory})
    assert (problems([provider], SUBDIR, ROOT) == []) is ok


def test_kubeconfig_is_checked_only_when_it_is_a_path_the_program_chose():
    text = "apiVersion: v1\nkind: Config\n"
    assert problems([resource("pulumi:providers:kubernetes", {"kubeconfig": text})], SUBDIR, ROOT) == []
    ambient = "/home/someone/.kube/config"
    provider = resource("pulumi:providers:kubernetes", {"kubeconfig": ambient})
    assert problems([provider], SUBDIR, ROOT, ambient_kubeconfig=ambient) == []
    assert len(problems([provider], SUBDIR, ROOT)) == 1


def test_secret_wrapped_and_list_path_inputs_are_checked():
    from cloudstation_tools.mocks import as_secret

    group = resource("kubernetes:yaml/v2:ConfigGroup", {"files": ["../Pulumi.yaml", "Pulumi.yaml"]})
    wrapped = resource("docker-build:index:Image", as_secret({"context": {"location": "entities"}}))
    found = problems([group, wrapped], SUBDIR, ROOT)
    assert len(found) == 2 and "'Pulumi.yaml'" in found[0] and "'entities'" in found[1], found


def test_the_table_names_each_input_once():
    keys = [(entry.type, entry.property) for entry in PATH_INPUTS]
    assert len(keys) == len(set(keys))


# --- stack config: paths relative to the directory of Pulumi.yaml -----------------------------


def kubernetes_problems(kubernetes: dict) -> list[str]:
    values = {**stacks.read("test").values, "cloudstation:kubernetes": json.dumps(kubernetes)}
    with pytest.raises(stack_config.ConfigError) as error:
        stacks.load(values)
    return error.value.problems


@pytest.mark.parametrize("directory", ["/tmp/rendered", "~/rendered", ""])
def test_render_yaml_to_directory_must_be_relative(directory):
    assert kubernetes_problems({"renderYamlToDirectory": directory}) == [
        f"cloudstation:kubernetes.renderYamlToDirectory: {directory!r} — must be a directory relative to "
        "the directory of Pulumi.yaml, e.g. rendered/test"
    ]


def test_render_yaml_to_directory_and_context_are_exclusive_as_in_the_provider():
    assert kubernetes_problems({"renderYamlToDirectory": "out", "context": "kind-x"}) == [
        "cloudstation:kubernetes.context: 'kind-x' — not allowed together with renderYamlToDirectory "
        "(the provider rejects both)"
    ]
