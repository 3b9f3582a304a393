"""The suite travels with the repository: a user's copy, with an entity and a project added the way
the docs say, passes the same checks.

The tests derive what they expect from the stack files and entities/ of the directory they sit in
(tests/conftest.py, tests/promoted.py and cloudstation_tools/render.py all locate the repository from their own
path). So this test does what a user does: it copies the repository (what a clone holds, without
.git, virtualenvs and generated files), then

1. adds an entity to the first project as entities/README.md says ("Adding your own entity": copy an
   entity of the same kind, add the snippet of step 3 to Pulumi.test.yaml);
2. adds a project as docs/operations.md says ("Add a project or an entity": its snippets applied to
   Pulumi.test.yaml, the same project in Pulumi.prod.yaml without `image:`), with the snippet's
   entity in JavaScript without a Dockerfile (one is generated) and a second one with its own;
3. runs, in the copy and with the copy's own code, `python -m infra render --stack test` and the
   test modules that check what projects and entities bring (both stacks rendered, prod as its
   first promotion writes it; schema validation and the workload standards; network policies;
   entities, entity images, stores, environments, docs), deselecting only the tests marked
   `example_stacks`: facts about the repository's own example stack files (README's diagram and the
   example stacks' cluster budget), which a user's additions rightly change.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.test_docs import _code_blocks, _dedent_block

# Run in the copy (one pytest process: both stacks are rendered once for all of them).
MODULES = [
    "tests/test_standards.py",
    "tests/test_network_policies.py",
    "tests/test_entities.py",
    "tests/test_entity_images.py",
    "tests/test_project_environments.py",
    "tests/test_stores.py",
    "tests/test_cloudstate.py",
    "tests/test_cluster_fit.py",
    "tests/test_docs.py",
    # A generated Dockerfile names base images no resource input shows (the content tag hashes them).
    "tests/test_engine_replacements.py::test_pins_a_stack_does_not_deploy_change_nothing_in_it[test]",
]
NOT_COPIED = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", ".cloudstation", ".pulumi-state",
              "rendered", "out", "user-function.desc"}
"""What a clone does not hold (.gitignore) or the user's own machine state."""
OWN_DOCKERFILE_ENTITY = "report"
"""The added project's second entity, which brings its own Dockerfile."""


def stack_config(copy: Path, stack: str) -> dict:
    return yaml.safe_load((copy / f"Pulumi.{stack}.yaml").read_text(encoding="utf-8"))["config"]


def write_stack_config(copy: Path, stack: str, config: dict) -> None:
    (copy / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False), encoding="utf-8")


def merge(base, snippet):
    """A snippet applied as the docs mean it: maps merge key by key, a list of named items gains
    the snippet's items (one of the same name replaced), any other value is replaced."""
    if isinstance(base, dict) and isinstance(snippet, dict):
        return {**base, **{key: merge(base.get(key), value) for key, value in snippet.items()}}
    if isinstance(base, list) and isinstance(snippet, list) and all(isinstance(i, dict) and "name" in i for i in snippet):
        names = {item["name"] for item in snippet}
        return [item for item in base if not (isinstance(item, dict) and item.get("name") in names)] + snippet
    return snippet


def entity_like(copy: Path, kind: str, language: str) -> Path:
    """The directory of an entity of the test stack of that kind and language with its own
    Dockerfile: what entities/README.md says to start from."""
    for project in stack_config(copy, "test")["cloudstation:projects"]:
        for entity in project["entities"]:
            source = copy / entity["source"]
            if (entity["kind"], entity["language"]) == (kind, language) and (source / "Dockerfile").is_file():
                return source
    raise AssertionError(f"the test stack has no {language} {kind} entity to copy")


def add_entity_directory(copy: Path, entity: dict, dockerfile: bool) -> None:
    target = copy / entity["source"]
    assert not target.exists(), f"{entity['source']} exists already: pick another example"
    shutil.copytree(entity_like(copy, entity["kind"], entity["language"]), target)
    if not dockerfile:
        (target / "Dockerfile").unlink()


def section(path: Path, title: str) -> str:
    text = path.read_text(encoding="utf-8")
    assert f"\n{title}\n" in text, f"{path.name} has no section {title!r}"
    return text.split(f"\n{title}\n", 1)[1].split("\n## ", 1)[0]


def operations_snippets() -> list[dict]:
    """The Pulumi.test.yaml snippets of docs/operations.md, "Add a project or an entity", in order."""
    blocks = _code_blocks(section(ROOT / "docs" / "operations.md", "## Add a project or an entity"), "yaml")
    snippets = [yaml.safe_load(_dedent_block(block)) for block in blocks]
    assert snippets and all(set(s) <= {"cloudstation:projects", "cloudstation:platform"} for s in snippets), snippets
    return snippets


def readme_entity() -> dict:
    """The entity of entities/README.md, "Adding your own entity", step 3."""
    blocks = _code_blocks(section(ROOT / "entities" / "README.md", "## Adding your own entity"), "yaml")
    [entity] = [item for block in blocks for item in yaml.safe_load(_dedent_block(block))]
    return entity


def add_like_the_docs(copy: Path) -> dict[str, list[str]]:
    """The user's changes; returns project -> the entity names added to it."""
    test, prod = stack_config(copy, "test"), stack_config(copy, "prod")
    added: dict[str, list[str]] = {}

    # An entity for an existing project (entities/README.md).
    entity = readme_entity()
    project = entity["source"].split("/")[1]  # entities/<project>/<entity>
    add_entity_directory(copy, entity, dockerfile=True)
    for config in (test, prod):
        [existing] = [p for p in config["cloudstation:projects"] if p["name"] == project]
        existing["entities"].append(dict(entity))
    added[project] = [entity["name"]]

    # A project (docs/operations.md): its snippets for the test stack, in order.
    snippets = operations_snippets()
    [new] = [p for snippet in snippets for p in snippet.get("cloudstation:projects", [])]
    assert new["name"] not in {p["name"] for p in test["cloudstation:projects"]}
    [first] = new["entities"]
    assert first["language"] == "javascript"
    add_entity_directory(copy, first, dockerfile=False)  # its Dockerfile is generated
    second = {"name": OWN_DOCKERFILE_ENTITY, "kind": "action", "language": "javascript",
              "source": f"entities/{new['name']}/{OWN_DOCKERFILE_ENTITY}"}
    add_entity_directory(copy, second, dockerfile=True)
    for snippet in snippets:
        if "cloudstation:projects" in snippet:  # the project with both entities
            snippet = {**snippet, "cloudstation:projects": [{**new, "entities": [first, second]}]}
        test = merge(test, snippet)
    # ... and the same project in prod, without images (the promotion writes them).
    prod["cloudstation:projects"].append({**new, "entities": [dict(first), dict(second)]})
    added[new["name"]] = [first["name"], second["name"]]

    write_stack_config(copy, "test", test)
    write_stack_config(copy, "prod", prod)
    return added


def copy_repository(destination: Path) -> Path:
    shutil.copytree(ROOT, destination, ignore=lambda directory, names: [n for n in names if n in NOT_COPIED
                                                                         or n.endswith(".pyc")])
    return destination


def run(copy: Path, *argv: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, *argv], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_users_copy_with_its_own_project_and_entities_passes_the_same_checks(tmp_path):
    copy = copy_repository(tmp_path / "clone")
    added = add_like_the_docs(copy)
    services = {f"{project}-{name}" for project, names in added.items() for name in names}
    no_dockerfile = [e["source"] for p in stack_config(copy, "test")["cloudstation:projects"] for e in p["entities"]
                     if not (copy / e["source"] / "Dockerfile").is_file()]
    assert len(no_dockerfile) == 1

    # The first-deploy checklist's first step: the stack file renders.
    done = run(copy, "-m", "infra", "render", "--stack", "test", "--out", "rendered/test", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    manifests = list(yaml.safe_load_all((copy / "rendered" / "test" / "manifests.yaml").read_text()))
    rendered_services = {o["metadata"]["name"] for o in manifests if o and o["kind"] == "StatefulService"}
    assert services <= rendered_services

    # The suite's checks, on the copy.
    report = tmp_path / "report.xml"
    done = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not example_stacks",
               f"--junitxml={report}", *MODULES, timeout=900)
    cases = ElementTree.parse(report).getroot().iter("testcase")
    outcome = {f"{c.get('classname')}.{c.get('name')}": next((child.tag for child in c), "passed") for c in cases}
    assert done.returncode == 0 and set(outcome.values()) == {"passed"}, (
        sorted(name for name, result in outcome.items() if result != "passed"), done.stdout[-5000:])
    # The user's entities were among the checked ones: with and without their own Dockerfile.
    for source in [*no_dockerfile, f"entities/{list(added)[-1]}/{OWN_DOCKERFILE_ENTITY}"]:
        checked = [name for name in outcome if "test_entities." in name and f"[{source}]" in name]
        assert len(checked) >= 5, (source, checked)
    assert len(outcome) > 200
