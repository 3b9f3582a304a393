"""The documentation and the CI workflow say what the code does: the config reference is
regenerated and compared, the operations guide's config examples validate, its commands exist,
its URNs and outputs are the program's, the README's diagram names the stacks' namespaces, and the
workflow runs what README says with the secrets the guide documents."""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pytest
import yaml
from pydantic import Field

from components.model import ConfigModel, DnsLabel
from cloudstation_tools import cli, config_reference
from infra.config import SECRET_KEYS, StackConfig, load
from tests.stacks import images_in_stack_registry
from tests import stacks
from tests.conftest import ROOT

OPERATIONS = ROOT / "docs" / "operations.md"
ARMADA = ROOT / "docs" / "armada.md"
README = ROOT / "README.md"
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^[ \t]*```{language}\n(.*?)^[ \t]*```", text, flags=re.S | re.M)


def _dedent_block(block: str) -> str:
    lines = block.splitlines()
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[indent:] for line in lines)


# --- config reference ----------------------------------------------------------------------------


def test_config_reference_is_current():
    committed = config_reference.DOC.read_text(encoding="utf-8")
    assert committed == config_reference.render(), (
        "docs/config-reference.md is stale: run `python -m infra config-reference`"
    )


def _stack_file_paths(value: Any, prefix: str) -> set[str]:
    """Key paths of a stack file's values in the reference's notation (`[]` for list items)."""
    paths = {prefix}
    if isinstance(value, dict):
        for key, item in value.items():
            paths |= _stack_file_paths(item, f"{prefix}.{key}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                paths |= _stack_file_paths(item, f"{prefix}[]") - {f"{prefix}[]"}
    return paths


@pytest.mark.parametrize("folder", [pytest.param(stacks.DIR, id="fixture"),
                                    pytest.param(ROOT, id="example", marks=pytest.mark.example_stacks)])
@pytest.mark.parametrize("stack", ["test", "prod"])
def test_reference_lists_every_key_the_stack_files_use(stack, folder):
    documented = {row.key for row in config_reference.rows()}
    config = yaml.safe_load((folder / f"Pulumi.{stack}.yaml").read_text())["config"]
    used: set[str] = set()
    for key, value in config.items():
        namespace, _, name = key.partition(":")
        if namespace == "cloudstation" and name not in SECRET_KEYS:
            used |= _stack_file_paths(value, name)
    # Free-form maps (`extra`, `labels`, ...) are documented as one key; their contents are not keys.
    free_form = {row.key for row in config_reference.rows() if row.type.startswith("map of string to")}
    used = {path for path in used if not any(path.startswith(f + ".") for f in free_form)}
    assert used and used <= documented, sorted(used - documented)


def test_reference_documents_secure_keys():
    text = config_reference.render()
    for key in SECRET_KEYS:
        assert f"| `cloudstation:{key}` |" in text


class _Inner(ConfigModel):
    """An inner section."""

    size: str = "1Gi"
    """How big."""


class _Item(ConfigModel):
    name: DnsLabel
    """Item name."""


class _Sample(ConfigModel):
    mode: Literal["managed", "external"] = "managed"
    """How it runs."""
    count: Annotated[int, Field(ge=1, le=5)] = 2
    inner: _Inner = _Inner(size="5Gi")
    optional_inner: Optional[_Inner] = None
    items: list[_Item] = []
    by_name: dict[str, _Inner] = {}


def test_rows_walk_nested_models_with_effective_defaults():
    rows = {row.key: row for row in config_reference.rows(_Sample)}
    assert list(rows) == [
        "mode", "count", "inner", "inner.size", "optionalInner", "optionalInner.size",
        "items", "items[].name", "byName", "byName.<name>.size",
    ]
    assert rows["mode"].type == "`managed` \\| `external`" and rows["mode"].default == "`managed`"
    assert rows["mode"].description == "How it runs."
    assert rows["count"].type == "integer (≥ 1, ≤ 5)" and rows["count"].default == "`2`"
    # The enclosing default (5Gi) wins over the class default (1Gi); a model without a field
    # docstring is described by its class docstring.
    assert rows["inner"].default == config_reference.SECTION and rows["inner"].description == "An inner section."
    assert rows["inner.size"].default == "`5Gi`"
    assert rows["optionalInner"].default == "unset" and rows["optionalInner.size"].default == "`1Gi`"
    assert rows["items"].type == "list of section" and rows["items"].default == "`[]`"
    assert rows["items[].name"].default == config_reference.REQUIRED
    assert rows["items[].name"].type.startswith("DNS label")
    assert rows["byName"].type == "map of string to section"


def test_reference_uses_effective_nested_defaults():
    rows = {row.key: row for row in config_reference.rows(StackConfig)}
    defaults = StackConfig.model_fields["platform"].annotation()
    # Armada's PostgreSQL section defaults its database to its own, not PostgresSettings' default.
    armada_database = defaults.armada.postgres.database
    assert armada_database != type(defaults.armada.postgres).model_fields["database"].default
    assert rows["platform.armada.postgres.database"].default == f"`{armada_database}`"
    assert rows["projects"].default == config_reference.REQUIRED
    assert rows["platform.projectState.source"].default == "`entities/project-state`"


def test_config_reference_command_writes_and_checks(tmp_path, capsys):
    out = tmp_path / "reference.md"
    assert cli.main(["config-reference", "--check", "--out", str(out)]) == 1
    assert cli.main(["config-reference", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == config_reference.render()
    assert cli.main(["config-reference", "--check", "--out", str(out)]) == 0
    out.write_text("old", encoding="utf-8")
    assert cli.main(["config-reference", "--check", "--out", str(out)]) == 1
    assert "stale" in capsys.readouterr().err


# --- operations guide ----------------------------------------------------------------------------


def _merged(base: dict, snippet: dict) -> dict:
    """A stack file's config with a snippet applied as the guide means it: each section the
    snippet names replaces that section of the key (lists are appended: the snippets show items
    to add; an item named like one already there, e.g. a project a user has added already,
    replaces it)."""
    config = dict(base)
    for key, value in snippet.items():
        old = config.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            config[key] = {**old, **value}
        elif isinstance(old, list) and isinstance(value, list):
            named = {item.get("name") for item in value if isinstance(item, dict)} - {None}
            config[key] = [item for item in old if not (isinstance(item, dict) and item.get("name") in named)] + value
        else:
            config[key] = value
    return config


def _config_snippets(path: Path = OPERATIONS) -> list[tuple[str, dict]]:
    snippets = []
    for block in _code_blocks(path.read_text(encoding="utf-8"), "yaml"):
        text = _dedent_block(block)
        data = yaml.safe_load(text)
        if isinstance(data, dict) and all(str(k).startswith("cloudstation:") for k in data):
            stack = "prod" if "Pulumi.prod.yaml" in text.splitlines()[0] else "test"
            snippets.append((stack, data))
    return snippets


@pytest.mark.parametrize("path, minimum", [(OPERATIONS, 3), (ARMADA, 2)], ids=lambda p: getattr(p, "name", p))
def test_config_examples_validate(path, minimum):
    snippets = _config_snippets(path)
    assert len(snippets) >= minimum, f"the config examples of {path.name} were not found"
    for stack, snippet in snippets:
        text = stacks.text() if stack == "prod" else (stacks.DIR / f"Pulumi.{stack}.yaml").read_text()
        base = yaml.safe_load(text)["config"]
        merged = images_in_stack_registry(_merged(base, snippet))  # an external registry holds the images
        config = load(merged, source=f"snippet for Pulumi.{stack}.yaml")
        # The snippet's values are really in the validated config (not silently dropped).
        dumped = {
            f"cloudstation:{name}": value
            for name, value in config.model_dump(mode="json", by_alias=True).items()
        }
        for key, value in snippet.items():
            if key.partition(":")[2] in SECRET_KEYS:  # `secure:` values: set, never in the model
                continue
            assert _contains(dumped[key], value), (key, value)


def _contains(actual: Any, expected: Any) -> bool:
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and _contains(actual[k], v) for k, v in expected.items())
    if isinstance(expected, list):
        return isinstance(actual, list) and all(any(_contains(a, e) for a in actual) for e in expected)
    return actual == expected


def test_a_broken_snippet_would_fail():
    # The check above can fail: the same machinery rejects a typo in a snippet.
    base = yaml.safe_load((stacks.DIR / "Pulumi.test.yaml").read_text())["config"]
    bad = {"cloudstation:platform": {"stores": {"postgres": {"mode": "external", "hots": "pg"}}}}
    with pytest.raises(Exception, match="hots"):
        load(_merged(base, bad))


def test_snippet_items_replace_items_of_the_same_name():
    base = {"cloudstation:projects": [{"name": "a", "store": "x"}, {"name": "b"}], "cloudstation:platform": {"n": 1}}
    merged = _merged(base, {"cloudstation:projects": [{"name": "a", "store": "y"}, {"name": "c"}]})
    assert merged["cloudstation:projects"] == [{"name": "b"}, {"name": "a", "store": "y"}, {"name": "c"}]
    assert merged["cloudstation:platform"] == {"n": 1}


def _subcommands(text: str) -> list[str]:
    """Every `python -m infra <subcommand>` the text mentions (`...` stands for any)."""
    return [name for name in re.findall(r"python -m infra ([\w.-]+)", text) if name != "..."]


def _full_commands(text: str) -> list[list[str]]:
    """The argument lists of the `python -m infra` command lines in shell code blocks."""
    commands = []
    for block in _code_blocks(text, "(?:bash|sh)"):
        for line in block.splitlines():
            if "python -m infra " not in line:
                continue
            command = re.split(r"\s(?:#|&&|\|)", line.split("python -m infra ", 1)[1])[0]
            commands.append(shlex.split(command))
    return commands


def _parses(argv: list[str]) -> bool:
    try:
        cli.parser().parse_args(argv)
    except SystemExit:
        return False
    return True


@pytest.mark.parametrize("path", [OPERATIONS, README], ids=lambda p: p.name)
def test_documented_infra_commands_exist(path):
    text = path.read_text(encoding="utf-8")
    subcommands = cli.parser()._subparsers._group_actions[0].choices
    mentioned = _subcommands(text)
    assert mentioned
    assert set(mentioned) <= set(subcommands), sorted(set(mentioned) - set(subcommands))
    commands = _full_commands(text)
    assert commands
    for argv in commands:
        assert _parses(argv), f"{path.name}: `python -m infra {shlex.join(argv)}` is not a valid command"


def test_command_check_rejects_bad_commands():
    assert not _parses(["promote", "--from", "test"])
    assert _full_commands("```bash\npython -m infra rollback --stack prod   # undo\n```\n") == [["rollback", "--stack", "prod"]]


def test_documented_scripts_exist():
    text = OPERATIONS.read_text(encoding="utf-8") + README.read_text(encoding="utf-8")
    scripts = set(re.findall(r"bash (scripts/[\w.-]+)", text))
    assert scripts >= {"scripts/up.sh", "scripts/test.sh"}
    for script in scripts:
        assert (ROOT / script).is_file(), script


def test_documented_urns_exist(rendered_stacks):
    urns = set(re.findall(r"urn:pulumi:[^'\s`]+", OPERATIONS.read_text(encoding="utf-8")))
    assert urns
    registered = {r.urn for stack in rendered_stacks.values() for r in stack.registrations}
    assert urns <= registered, sorted(urns - registered)


def test_every_stack_output_is_documented(rendered_stacks):
    text = OPERATIONS.read_text(encoding="utf-8")
    section = text.split("## Stack outputs", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    outputs = {name for stack in rendered_stacks.values() for name in stack.outputs}
    assert documented == outputs


def test_links_resolve():
    for path in [README, OPERATIONS]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name} links to missing {target}"


@pytest.mark.example_stacks  # README describes the repository's own stack files, not a user's
def test_readme_diagram_names_every_namespace_of_both_stacks(example_rendered):
    rendered_stacks = example_rendered
    diagrams = _code_blocks(README.read_text(encoding="utf-8"), "mermaid")
    assert len(diagrams) == 1
    diagram = diagrams[0]
    for stack in rendered_stacks.values():
        namespaces = {
            o["metadata"]["name"] for o in stack.manifests() if o["kind"] == "Namespace"
        }
        for namespace in namespaces:
            assert f"namespace {namespace}]" in diagram, f"{stack.stack}: namespace {namespace} missing"
        assert f"NodePort {stack.outputs['registry']['nodePort']}" in diagram


# --- CI workflow ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workflow() -> dict:
    data = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def _steps(workflow: dict, job: str) -> list[dict]:
    return workflow["jobs"][job]["steps"]


def _runs(workflow: dict, job: str) -> str:
    return "\n".join(step.get("run", "") for step in _steps(workflow, job))


def test_workflow_triggers_and_jobs(workflow):
    assert "pull_request" in workflow["on"]
    assert workflow["on"]["push"]["branches"] == ["main"]
    assert set(workflow["jobs"]) == {"test", "preview", "deploy"}
    assert "pull_request" in workflow["jobs"]["preview"]["if"]
    assert "refs/heads/main" in workflow["jobs"]["deploy"]["if"]
    assert workflow["jobs"]["preview"]["needs"] == "test" and workflow["jobs"]["deploy"]["needs"] == "test"


def test_every_action_is_pinned_to_a_version(workflow):
    uses = [step["uses"] for job in workflow["jobs"] for step in _steps(workflow, job) if "uses" in step]
    assert uses
    for use in uses:
        name, _, ref = use.partition("@")
        assert re.fullmatch(r"v\d+(\.\d+){0,2}|[0-9a-f]{40}", ref), f"{use} is not pinned"
    assert any(use.startswith("pulumi/actions@") for use in uses)  # SHA pins: tests/test_ci_workflow.py


def test_test_job_runs_the_readme_command_and_renders_both_stacks(workflow):
    readme = README.read_text(encoding="utf-8")
    assert "bash scripts/test.sh" in readme
    runs = _runs(workflow, "test")
    assert re.search(r"^bash scripts/test\.sh$", runs, flags=re.M)
    assert "pip install --disable-pip-version-check -r requirements.txt" in runs
    python = [s for s in _steps(workflow, "test") if s.get("uses", "").startswith("actions/setup-python@")]
    assert python and python[0]["with"]["python-version"] == "3.11"
    for stack in ("test", "prod"):
        assert f"python -m infra render --stack {stack} --out rendered/{stack}" in runs
    upload = [s for s in _steps(workflow, "test") if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload and upload[0]["with"]["path"] == "rendered/"


def test_preview_runs_through_pulumi_actions_with_the_policy_pack(workflow):
    job = workflow["jobs"]["preview"]
    action = [s for s in job["steps"] if s.get("uses", "").startswith("pulumi/actions@")]
    assert len(action) == 1
    inputs = action[0]["with"]
    assert inputs["command"] == "preview" and inputs["stack-name"] == "test"
    assert inputs["comment-on-pr"] is True and inputs["policyPacks"] == "policy"
    assert inputs["cloud-url"] == "${{ secrets.PULUMI_BACKEND_URL }}"
    assert action[0]["env"]["PULUMI_CONFIG_PASSPHRASE"] == "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"
    assert job["permissions"]["pull-requests"] == "write"
    assert "KUBECONFIG" in _runs(workflow, "preview")


def test_deploy_runs_up_with_the_port_forwards(workflow):
    runs = _runs(workflow, "deploy")
    assert re.search(r"^bash scripts/up\.sh test\b", runs, flags=re.M)
    # scripts/up.sh is what opens the port-forwards `pulumi up` needs.
    script = (ROOT / "scripts" / "up.sh").read_text(encoding="utf-8")
    assert "python -m infra port-forwards --stack" in script and "pulumi up" in script
    assert workflow["jobs"]["deploy"]["concurrency"]["cancel-in-progress"] is False


@pytest.mark.parametrize("job", ["preview", "deploy"])
def test_policy_pack_gets_the_virtualenv_its_runtime_names(workflow, job):
    pack = yaml.safe_load((ROOT / "policy" / "PulumiPolicy.yaml").read_text(encoding="utf-8"))
    venv = pack["runtime"]["options"]["virtualenv"]
    runs = _runs(workflow, job)
    assert f"python -m venv policy/{venv}\n" in runs + "\n"
    assert f"policy/{venv}/bin/pip install --disable-pip-version-check -r policy/requirements.txt" in runs
    assert "policy" in (workflow["jobs"][job]["steps"][-1].get("with", {}).get("policyPacks", "")
                        + workflow["jobs"][job]["steps"][-1].get("run", ""))


def test_workflow_secrets_are_the_documented_ones():
    used = set(re.findall(r"secrets\.(\w+)", WORKFLOW.read_text(encoding="utf-8"))) - {"GITHUB_TOKEN"}
    section = OPERATIONS.read_text(encoding="utf-8").split("### Secrets", 1)[1].split("\n### ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    assert used and used == documented


# --- supported Kubernetes versions ------------------------------------------------------------------

# "1.33 to 1.37", "1.33–1.37" (a Kubernetes range) and "1.33+" (a lower bound); not an image tag.
_K8S_RANGE = re.compile(r"(?<![\w.:/-])(1\.\d\d)\s*(?:to|–|-)\s*(1\.\d\d)(?![\w.])")
_K8S_FLOOR = re.compile(r"(?<![\w.:/-])(1\.\d\d)\+")


def test_docs_state_the_supported_kubernetes_versions():
    """Every Kubernetes version range README.md and docs/ state is cloudstation_tools/validate.py's
    SUPPORTED_VERSIONS, the versions every object is validated against; README states it."""
    from cloudstation_tools.validate import SUPPORTED_VERSIONS

    supported = (SUPPORTED_VERSIONS[0], SUPPORTED_VERSIONS[-1])
    stated: dict[str, list[tuple[str, ...]]] = {}
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        found = _K8S_RANGE.findall(text) + [(floor,) for floor in _K8S_FLOOR.findall(text)]
        if found:
            stated[path.relative_to(ROOT).as_posix()] = found
    assert any(README.name == name for name in stated), "README.md states no supported Kubernetes range"
    wrong = {
        name: ranges
        for name, ranges in stated.items()
        if any(r != supported[: len(r)] for r in ranges)
    }
    assert not wrong, f"Kubernetes versions stated other than {supported[0]} to {supported[1]}: {wrong}"


# --- docs/security.md: its guards exist, its Pod Security exceptions are the stacks' -------------------

SECURITY = ROOT / "docs" / "security.md"


def defined_tests() -> set[str]:
    return {name for folder in ("tests", "e2e") for path in sorted((ROOT / folder).glob("test_*.py"))
            for name in re.findall(r"^\s*def (test_\w+)\(", path.read_text(encoding="utf-8"), flags=re.M)}


def test_every_guard_docs_security_names_exists():
    """docs/security.md: "Every claim below is guarded by a test named in its section". A test it names
    that does not exist guards nothing: its "holds exactly upstream's ClusterRole
    (`test_cluster_role_is_exactly_upstreams`)" was such a name, for an operator that holds no
    ClusterRole at all (e2e/test_security.py checks it against the API server)."""
    text = SECURITY.read_text(encoding="utf-8")
    named = set(re.findall(r"`(test_\w+)`", text))
    assert named and sorted(named - defined_tests()) == []
    files = set(re.findall(r"\b(tests/test_\w+\.py|e2e/test_\w+\.py)", text))
    assert sorted(f for f in files if not (ROOT / f).is_file()) == []


def test_the_pod_security_exceptions_of_docs_security_are_every_relaxed_namespace(rendered_stacks):
    """docs/security.md's lead: "Every workload meets Pod Security "restricted" except ...": every
    namespace a stack enforces below restricted is named there for what runs in it: the entity
    namespaces (the operator's pods), the job namespaces (`jobNamespacePodSecurity`) and the builds
    namespace (kaniko: components/build_job.py POD_SECURITY_LEVEL, whose build pods the end-to-end
    tier sees warned for restricted; it was missing)."""
    from tests.stacks import config_of

    text = SECURITY.read_text(encoding="utf-8")
    [sentence] = re.findall(r"^Every workload meets Pod Security .*?(?=\n\n)", text, flags=re.M | re.S)
    sentence = " ".join(sentence.split())
    for stack, rendered in rendered_stacks.items():
        config = config_of(rendered)
        entity_namespaces = {rendered.outputs["projectStateNamespace"], *rendered.outputs["projectNamespaces"].values()}
        for namespace in (o for o in rendered.manifests() if o["kind"] == "Namespace"):
            name = namespace["metadata"]["name"]
            if namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted":
                continue
            if name in entity_namespaces:
                phrase = "operator-made entity pods"
            elif name in config.platform.armada.job_namespaces:
                phrase = "`jobNamespacePodSecurity`"
            elif name == config.platform.builds_namespace:
                phrase = "builds namespace"
            else:
                phrase = f"namespace {name}"
            assert phrase in sentence, f"{stack}: {name} enforces below restricted; docs/security.md: {sentence!r}"
