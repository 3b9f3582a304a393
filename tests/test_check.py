"""`cloudstation check` (cloudstation_tools/check/): the repository's own example stack files pass it, and
each mistake of issue 21 gives one clear finding with its file, line, key, value and fix, all at once,
with the exit codes CI relies on (0 clean or notices and warnings only, 1 errors, 2 could not run).

The cases run in a project folder of their own (Pulumi.yaml, __main__.py, entities/ and the base pair
of fixture stack files, tests/stacks/, edited per case): the program is this checkout's, the stack
files are the case's. Only the check of the example stack files themselves reads the root's."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import yaml

from cloudstation_tools import check, cli, render
from cloudstation_tools.check.findings import ERROR, NOTICE, WARNING
from tests import stacks
from tests.conftest import ROOT

PROJECT_FILES = ("Pulumi.yaml", "__main__.py")
ENTITIES = ("entities", "tests/stacks/entities")
"""The entity sources the fixture stacks name."""


@pytest.fixture
def project(tmp_path) -> Path:
    """A project folder with the fixture stack files (not a git work tree: no baseline by default)."""
    root = tmp_path / "project"
    root.mkdir()
    for name in PROJECT_FILES:
        shutil.copy(ROOT / name, root / name)
    for stack in stacks.BASE:
        shutil.copy(stacks.DIR / f"Pulumi.{stack}.yaml", root / f"Pulumi.{stack}.yaml")
    for folder in ENTITIES:
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("node_modules"))
    return root


def config_of(root: Path, stack: str) -> dict:
    return yaml.safe_load((root / f"Pulumi.{stack}.yaml").read_text(encoding="utf-8"))["config"]


def write(root: Path, stack: str, config: dict) -> str:
    text = yaml.safe_dump({"config": config}, sort_keys=False)
    (root / f"Pulumi.{stack}.yaml").write_text(text, encoding="utf-8")
    return text


def edit(root: Path, stack: str, change: Callable[[dict], None]) -> str:
    config = config_of(root, stack)
    change(config)
    return write(root, stack, config)


def line_of(text: str, needle: str, after: str = "") -> int:
    """1-based line of the first `needle` below the first `after`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i, line in enumerate(lines) if i >= start and needle in line) + 1


def errors(report) -> list:
    return [f for f in report.findings if f.severity == ERROR]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- the repository's own example stack files (issue 21 item 2) ----------------------------------


@pytest.mark.example_stacks  # the repository's own example stack files (tests/user_files.py)
def test_the_example_stack_files_pass_check(capsys):
    code, out, err = run_cli(capsys, "--root", str(ROOT), "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["exitCode"] == 0, out + err
    assert report["stacks"] == ["Pulumi.prod.yaml", "Pulumi.test.yaml"]
    assert [f for f in report["findings"] if f["severity"] == ERROR] == []
    # Before its first promotion prod says what to run: a step of the flow, not a mistake.
    promotion = [f for f in report["findings"] if f["check"] == "promotion"]
    assert promotion and all(f["severity"] == NOTICE for f in promotion), promotion


# --- one clear problem per mistake, with file and line ---------------------------------------------


def _typo_namespace(root):
    text = (root / "Pulumi.prod.yaml").read_text()
    text = text.replace("  cloudstation:kubernetes: {}\n", "  cloudstaton:kubernetes: {context: kind-prod}\n", 1)
    (root / "Pulumi.prod.yaml").write_text(text)
    return "prod", "cloudstaton:kubernetes", line_of(text, "cloudstaton:kubernetes"), "did you mean 'cloudstation:kubernetes'?"


def _request_above_limit(root):
    def change(config):
        config["cloudstation:platform"]["armada"]["pulsar"]["resources"]["cpuRequest"] = "2"
    text = edit(root, "test", change)
    return ("test", "cloudstation:platform.armada.pulsar.resources.cpuRequest", line_of(text, "cpuRequest"),
            "more than cpuLimit '1'")


def _extra_secret(root):
    def change(config):
        config["cloudstation:platform"]["armada"]["server"] = {"extra": {"postgres": {"connection": {"password": "hunter2"}}}}
    text = edit(root, "test", change)
    return ("test", "cloudstation:platform.armada.server.extra.postgres.connection.password",
            line_of(text, "password: hunter2"), "--secret")


def _flat_key(root):
    def change(config):
        config["cloudstation:platform.registry.nodePort"] = 32001
    text = edit(root, "test", change)
    return ("test", "cloudstation:platform.registry.nodePort", line_of(text, "cloudstation:platform.registry.nodePort"),
            "pulumi config set --path 'cloudstation:platform.registry.nodePort' 32001")


def _owner_secret(root):
    def change(config):
        del config["cloudstation:platform"]["registry"]["ownerNamespace"]
    text = edit(root, "prod", change)
    return ("prod", "cloudstation:platform.registry.ownerNamespace", line_of(text, "registry:"),
            "reads the Secret cloudstation-prod/registry-auth")


def _prod_in_tests_namespace(root):
    def change(config):
        config["cloudstation:platform"]["namespace"] = "cloudstation"
    text = edit(root, "prod", change)
    return ("prod", "cloudstation:platform.namespace", line_of(text, "namespace: cloudstation"),
            "would be deployed by both Pulumi.prod.yaml and Pulumi.test.yaml")


def _owner_namespace_typo(root):
    def change(config):
        config["cloudstation:platform"]["registry"]["ownerNamespace"] = "cloudstaton"
    text = edit(root, "prod", change)
    return ("prod", "cloudstation:platform.registry.ownerNamespace", line_of(text, "ownerNamespace: cloudstaton"),
            "the stacks of this cluster create 'registry-auth' in cloudstation")


@pytest.mark.parametrize("case", [_typo_namespace, _request_above_limit, _extra_secret, _flat_key, _owner_secret,
                                  _owner_namespace_typo, _prod_in_tests_namespace], ids=lambda c: c.__name__.strip("_"))
def test_each_mistake_is_one_clear_problem_with_file_and_line(project, case):
    stack, key, line, says = case(project)
    report = check.run(project)
    assert report.exit_code == 1
    [finding] = errors(report)
    assert (finding.file, finding.key, finding.line) == (f"Pulumi.{stack}.yaml", key, line), finding
    assert says in finding.message, finding.message
    assert finding.text().startswith(f"Pulumi.{stack}.yaml:{line}: error: {key}: ")


def test_every_problem_of_a_file_is_reported_at_once(project, capsys):
    def change(config):
        config["cloudstation:platform"]["namespcae"] = "x"
        config["cloudstation:projects"][0]["entities"][0]["kind"] = "evented"
        config["cloudstation:platform.registry.nodePort"] = 32001
        config["cloudstation:platform"]["registry"]["resources"] = {"memoryRequest": "1Gi", "memoryLimit": "512Mi"}
    text = edit(project, "test", change)
    code, out, _ = run_cli(capsys, "--root", str(project), "--stack", "test")
    assert code == 1
    lines = {line.split(": error: ", 1)[0] for line in out.splitlines() if ": error: " in line}
    assert lines == {f"Pulumi.test.yaml:{line_of(text, needle)}" for needle in (
        "namespcae", "kind: evented", "cloudstation:platform.registry.nodePort", "memoryRequest")}, out
    assert "did you mean 'namespace'?" in out and "must be one of" in out


def test_two_stacks_owning_one_cluster_collide(project):
    shutil.copy(project / "Pulumi.test.yaml", project / "Pulumi.staging.yaml")  # a third stack, copied from test
    report = check.run(project, stack="staging")
    found = [f for f in errors(report) if f.check == "clusters"]  # (and the cluster's budget, three stacks' worth)
    assert {f.file for f in found} == {"Pulumi.staging.yaml"}  # test is the owner prod names: staging yields
    cluster = [f for f in found if f.key == "cloudstation:platform.ownsClusterResources"]
    assert len(cluster) == 1 and "CustomResourceDefinition" in cluster[0].message and "Pulumi.test.yaml" in cluster[0].message
    assert "the current kube context" in cluster[0].message
    namespaces = {f.value for f in found if f.key != "cloudstation:platform.ownsClusterResources"}
    assert {"'cloudstation'", "'shop'", "'armada'"} <= namespaces, [f.text() for f in found]
    # On clusters of their own (their contexts differ), nothing collides.
    edit(project, "staging", lambda c: c.__setitem__("cloudstation:kubernetes", {"context": "kind-staging"}))
    assert errors(check.run(project, stack="staging")) == []


def test_the_cluster_budget_is_the_owners_setting(project):
    def scale(config):
        config["cloudstation:platform"].pop("clusterBudget", None)  # the default (the fixture sets a bigger one)
        config["cloudstation:projects"][0]["entities"][0]["replicas"] = 4
    edit(project, "test", scale)
    report = check.run(project)
    [finding] = errors(report)
    text = (project / "Pulumi.test.yaml").read_text()
    assert (finding.file, finding.key, finding.line, finding.check) == (
        "Pulumi.test.yaml", "cloudstation:platform.clusterBudget", line_of(text, "cloudstation:platform:"), "budget")
    assert "> 6Gi" in finding.message and "shop-test" in finding.message, finding.message
    edit(project, "test", lambda c: c["cloudstation:platform"].__setitem__("clusterBudget", {"cpu": "8", "memory": "16Gi"}))
    assert errors(check.run(project)) == []


# --- notices: the flow's next steps ------------------------------------------------------------------


def _add_wishlist(root: Path, stack: str) -> None:
    # The likes entity's source: the program renders entity sources of its own checkout (infra/context.py ROOT).
    def change(config):
        entity = {"name": "wishlist", "kind": "replicated", "language": "javascript", "source": "entities/shop/likes"}
        config["cloudstation:projects"][0]["entities"].append(entity)
    edit(root, stack, change)


def test_an_entity_added_to_test_first_is_a_notice_for_prod(project):
    (project / "Pulumi.prod.yaml").write_text(stacks.text())  # prod promoted once
    _add_wishlist(project, "test")
    report = check.run(project)
    assert report.exit_code == 0, [f.text() for f in errors(report)]
    [notice] = [f for f in report.findings if f.check == "promotion"]
    assert notice.severity == NOTICE and notice.file == "Pulumi.prod.yaml"
    assert "shop/wishlist is in Pulumi.test.yaml and not in Pulumi.prod.yaml" in notice.message
    assert "python -m infra promote --from test --to prod --entity shop/wishlist" in notice.message
    # Added to prod too, without an image (the docs' step 4): promote it.
    _add_wishlist(project, "prod")
    report = check.run(project)
    assert report.exit_code == 0, [f.text() for f in errors(report)]
    [notice] = [f for f in report.findings if f.check == "promotion"]
    assert "shop/wishlist has no image in Pulumi.prod.yaml yet" in notice.message
    text = (project / "Pulumi.prod.yaml").read_text()
    assert notice.line == line_of(text, "- name: wishlist")


def test_before_the_first_promotion_an_entity_in_one_stack_only_is_named_too(project):
    """The first promotion refuses an entity that is in only one of the stacks: with prod never
    promoted, `check` names it beside the promotion still to do (before, it said only the latter, and
    the promotion it advised then failed)."""
    _add_wishlist(project, "test")
    report = check.run(project)
    assert report.exit_code == 0, [f.text() for f in errors(report)]
    never, wishlist = [f for f in report.findings if f.check == "promotion"]
    assert "Pulumi.prod.yaml was never promoted" in never.message
    assert wishlist.severity == NOTICE and wishlist.key == "cloudstation:projects[0]", wishlist
    assert wishlist.message.startswith("shop/wishlist is in Pulumi.test.yaml and not in Pulumi.prod.yaml: add it here "
                                       "without `image:`"), wishlist.message
    assert wishlist.message.endswith("`python -m infra promote --from test --to prod`"), wishlist.message  # all at once
    # The other order: in prod only.
    (project / "Pulumi.test.yaml").write_text((stacks.DIR / "Pulumi.test.yaml").read_text())
    _add_wishlist(project, "prod")
    report = check.run(project)
    assert report.exit_code == 0, [f.text() for f in errors(report)]
    never, wishlist = [f for f in report.findings if f.check == "promotion"]
    assert "Pulumi.prod.yaml was never promoted" in never.message
    assert "shop/wishlist has no image in Pulumi.prod.yaml yet (prod cannot deploy it): add it to Pulumi.test.yaml" \
        in wishlist.message
    assert wishlist.line == line_of((project / "Pulumi.prod.yaml").read_text(), "- name: wishlist")


def test_an_entity_added_to_prod_first_says_to_add_it_to_test(project):
    (project / "Pulumi.prod.yaml").write_text(stacks.text())
    _add_wishlist(project, "prod")
    report = check.run(project)
    assert report.exit_code == 0, [f.text() for f in errors(report)]
    [notice] = [f for f in report.findings if f.check == "promotion"]
    assert "add it to Pulumi.test.yaml, deploy test, then promote it" in notice.message


# --- data left behind ---------------------------------------------------------------------------------


def test_a_store_switch_warns_of_the_claims_it_leaves_behind(project, tmp_path, capsys):
    before = tmp_path / "before"
    render.write(render.render("test", project), before)

    def external(config):
        config["cloudstation:platform"]["stores"]["postgres"] = {
            "mode": "external", "host": "pg.internal.example.com", "cidrs": ["10.20.0.0/24"],
            "credentialsSecret": {"namespace": "ops", "name": "cloudstation-postgres"}}
    text = edit(project, "test", external)
    code, out, _ = run_cli(capsys, "--root", str(project), "--stack", "test", "--against", str(before), "--format", "json")
    report = json.loads(out)
    assert code == 0, out
    [warning] = [f for f in report["findings"] if f["severity"] == WARNING]
    assert (warning["key"], warning["line"], warning["check"]) == (
        "cloudstation:platform.stores.postgres.mode", line_of(text, "mode: external"), "data")
    for claim in ("shop-test/data-shop-postgres-0", "cloudstation-state/data-project-state-postgres-0"):
        assert claim in warning["message"]
    assert "-n shop-test delete pvc data-shop-postgres-0" in warning["message"]
    assert f"compared with the render in {before}" in warning["message"]
    # The credentials Secret is the user's to create: said, not an error.
    assert any("ops/cloudstation-postgres" in f["message"] for f in report["findings"] if f["severity"] == NOTICE)


# --- formats and exit codes ----------------------------------------------------------------------------


def test_github_annotations_escape_and_locate(project, capsys):
    _typo_namespace(project)
    code, out, _ = run_cli(capsys, "--root", str(project), "--format", "github")
    assert code == 1
    [annotation] = [line for line in out.splitlines() if line.startswith("::error ")]
    assert annotation.startswith("::error file=Pulumi.prod.yaml,line=") and "title=cloudstation check (config)::" in annotation
    assert "%0A" not in annotation.split("::", 2)[1]


def test_could_not_run_is_exit_2(project, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli(capsys, "--root", str(empty))
    assert code == 2 and "no stack file" in err
    code, _, err = run_cli(capsys, "--root", str(project), "--stack", "staging")
    assert code == 2 and "Pulumi.test.yaml" in err
    code, out, _ = run_cli(capsys, "--root", str(project), "--against", "no-such-ref", "--format", "json")
    assert code == 2 and "not a git work tree" in json.loads(out)["couldNotRun"]
    one = tmp_path / "one"
    one.mkdir()
    (one / "resources.json").write_text("[]")
    code, _, err = run_cli(capsys, "--root", str(project), "--against", str(one))  # one stack's render, two stacks
    assert code == 2 and "--stack" in err


# --- the docs ----------------------------------------------------------------------------------------


def test_the_docs_name_check_as_the_first_thing_to_run_after_an_edit():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.index("python -m infra check") < readme.index("bash scripts/up.sh test")
    checklist = readme.split("### First-deploy checklist", 1)[1]
    assert checklist.split("\n2. ", 1)[0].lstrip().startswith("1. `python -m infra check` ")
    section = readme.split("## Check a change", 1)[1].split("\n## ", 1)[0]
    for fragment in ("exit", "--format json", "--format github", "--stack", "--against", "diff --stack"):
        assert fragment in section, fragment
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    first_block = operations.split("```bash\n", 1)[1].split("```", 1)[0]
    assert first_block.splitlines()[0].startswith(".venv/bin/python -m infra check"), first_block
    assert "## Check a change" in operations
    steps = (ROOT / "entities" / "README.md").read_text(encoding="utf-8")
    assert "python -m infra check" in steps


# --- the checks across stack files, on small graphs ---------------------------------------------------


class _Rendered:
    def __init__(self, objects: list[dict], reads: dict | None = None):
        self.objects, self.reads = objects, reads or {}

    def manifests(self) -> list[dict]:
        return self.objects


def _stack(name: str, objects: list[dict], **platform) -> "check.Stack":
    from infra import config, stack_yaml
    from tests.test_config import raw

    platform = {"builds": {"publicEgress": {"enabled": True}}, **platform}
    values = raw(platform=platform)
    text = yaml.safe_dump({"config": {k: json.loads(v) if k != "cloudstation:environment" else v
                                      for k, v in values.items()}}, sort_keys=False)
    stack = check.Stack(name, f"Pulumi.{name}.yaml", stack_yaml.KeyLines(text), raw={}, config=config.load(values))
    stack.raw = yaml.safe_load(text)["config"]
    stack.rendered = _Rendered(objects)
    return stack


def _service(namespace: str, name: str, node_port: int) -> dict:
    return {"kind": "Service", "metadata": {"namespace": namespace, "name": name},
            "spec": {"type": "NodePort", "ports": [{"port": 5000, "nodePort": node_port}]}}


def test_a_node_port_two_stacks_of_one_cluster_use_is_refused():
    from cloudstation_tools.check import across

    first = _stack("test", [_service("cloudstation", "registry", 32000)])
    second = _stack("staging", [_service("staging", "registry", 32000)], namespace="staging",
                    registry={"nodePort": 32000})
    [finding] = across.collisions([first, second], "context:")
    assert (finding.file, finding.key, finding.value, finding.line) == (
        "Pulumi.staging.yaml", "cloudstation:platform.registry.nodePort", "32000",
        second.lines.line("cloudstation:platform.registry.nodePort"))
    assert "Service cloudstation/registry's in Pulumi.test.yaml" in finding.message
    second.rendered = _Rendered([_service("staging", "registry", 32001)])
    assert across.collisions([first, second], "context:") == []


def test_which_stacks_share_a_cluster():
    from cloudstation_tools.check import across

    def kubernetes(stack, **settings):
        stack.config = stack.config.model_copy(update={"kubernetes": stack.config.kubernetes.model_copy(update=settings)})

    test = _stack("test", [])
    other = _stack("other", [])
    stacks = {"test": test, "other": other}
    assert across.cluster_of(test, stacks) == across.cluster_of(other, stacks) == "context:"  # both: current context
    kubernetes(other, context="kind-other")
    assert across.cluster_of(other, stacks) == "context:kind-other" != across.cluster_of(test, stacks)
    kubernetes(other, context=None, render_yaml_to_directory="rendered/other")
    assert across.cluster_of(other, stacks) == "render:other"  # writes manifests: no cluster


def test_the_rendered_graph_is_held_to_the_schemas_and_the_policy_pack(tmp_path):
    """graph.py: what the program renders wrong is named with its object and rule (a schema error, a
    container without limits), custom resources against the CRDs of their cluster."""
    from cloudstation_tools.check import graph
    from cloudstation_tools.mocks import Registration
    from tests.test_policy import container, deployment

    type_, bad = deployment(container(resources={"requests": {"cpu": "10m", "memory": "16Mi"}}))
    bad["spec"]["replicas"] = "two"
    registration = Registration("urn:pulumi:test::cloudstation::" + type_ + "::web", type_, "web", True, "", "", [], bad)
    stack = _stack("test", [bad])
    stack.rendered.registrations = [registration]
    stack.values = render.StackFile({"cloudstation:environment": "test"}, [])
    [schema] = graph.schemas(stack)
    assert schema.check == "schemas" and "Deployment apps/web @ 1.33, 1.34, 1.35, 1.36, 1.37: spec.replicas" in schema.message
    found = {(f.check, f.message.split(": ", 1)[1]) for f in graph.policy(stack, tmp_path)}
    assert ("policy:container-resources", "no cpu limit (`pulumi preview --policy-pack policy` refuses it)") in found
    custom = {"apiVersion": "cloudstate.io/v1alpha1", "kind": "StatefulService", "metadata": {"name": "s", "namespace": "n"}}
    stack.rendered = _Rendered([custom])
    assert "no CRD among the rendered objects" in graph.schemas(stack)[0].message
    [notice] = graph.schemas(stack, crds_known=False)  # the owner did not render: said once, not per object
    assert notice.severity == NOTICE
