"""A user's stack files are theirs (issue 21, item 2): the edits the docs tell a newcomer to make
leave `bash scripts/test.sh` green.

By construction: the suite tests the program on its fixture stacks (tests/stacks/), and
tests/conftest.py fails every test that reads a stack file at the repository's root unless it is
marked `example_stacks`; those run only while the root's stack files are the example as recorded
(tests/stacks/example.sha256) and are skipped once the user edited them (tests/user_files.py). So no
edit of Pulumi.test.yaml or Pulumi.prod.yaml can turn a test red. Shown here twice:

1. the guard itself, on a copy of the repository with probe tests: a test that reads a root stack
   file in its own process, through a Python child or through the program's own cross-stack read
   fails with the guard's message; one that reads the fixtures passes; a marked one runs while the
   files are the example and is skipped once they are edited; a read while the test modules are
   imported stops the run (the failure users saw: pytest collected nothing);
2. the newcomer paths, each applied as the docs write it to the example stack files, in a copy of
   the repository: add an entity to the test stack first (entities/README.md), to the prod stack
   first, or to both stacks, add the project of docs/operations.md (`inventory`, an entity without
   a Dockerfile), switch a project to `store: cassandra`, use an external PostgreSQL
   (docs/operations.md "Use external stores"), scale prod up (`replicas: 2`). Each edited stack
   file renders (and prod promotes, once both stacks have the same entities), and `python -m infra
   check` reports exactly what is left to do (the promotion steps as notices, with exit 0; the
   example's cluster budget where a path exceeds it, as an error with its fix); then, with every
   path applied at once, the copy's suite
   collects, its `example_stacks` tests are skipped, and the test modules that failed on these
   edits before (README diagram, cluster budget, stores, entities, ...) pass there.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Callable

import pytest
import yaml

from infra import versions
from tests import stacks, user_files
from tests.conftest import ROOT
from tests.test_docs import _code_blocks, _dedent_block

# --- running pytest in a copy ---------------------------------------------------------------------


def run(copy: Path, *argv: str, timeout: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER",
                                                           "PYTEST_XDIST_WORKER_COUNT")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run([sys.executable, *argv], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)


def pytest_in(copy: Path, report: Path, *argv: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict]:
    """Run pytest in `copy` (its own conftest, guard and fixtures); test id -> (outcome, message)."""
    done = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", f"--junitxml={report}", *argv,
               timeout=timeout)
    outcomes = {}
    if report.is_file():
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            children = [child for child in case if child.tag in ("failure", "error", "skipped")]
            outcome = children[0].tag if children else "passed"
            message = (children[0].get("message") or "") + (children[0].text or "") if children else ""
            outcomes[case.get("name")] = (outcome, message)
    return done, outcomes


# --- 1. the guard ---------------------------------------------------------------------------------

PROBES = '''
import subprocess, sys

import pytest

from cloudstation_tools import render
from tests import stacks
from tests.conftest import ROOT


def test_reads_in_its_own_process():
    assert "config:" in (ROOT / "Pulumi.test.yaml").read_text()


def test_reads_through_a_python_child():
    subprocess.run([sys.executable, "-c", f"open({str(ROOT / 'Pulumi.prod.yaml')!r}).read()"], check=True)


def test_reads_through_the_programs_cross_stack_check():
    # A fixture stack file rendered with the default stack directory: the program reads the
    # stacks sharing its cluster from the root.
    render.render("test", ROOT, stack_file=stacks.read("test"))


def test_reads_the_fixtures_only():
    assert stacks.rendered("test").outputs["images"]


@pytest.mark.example_stacks
def test_marked_reads_the_example():
    render.render("test", ROOT)
'''

IMPORT_PROBE = '''
from tests.conftest import ROOT

TEXT = (ROOT / "Pulumi.test.yaml").read_text()


def test_never_runs():
    assert TEXT
'''


def test_a_test_that_reads_a_user_stack_file_fails_unless_marked(tmp_path):
    copy = stacks.copy_repository(tmp_path / "repo")  # its root's stack files: the fixture pair
    done = run(copy, "-m", "tests.user_files", "--record", timeout=60)  # ... recorded as its example
    assert done.returncode == 0, done.stderr
    (copy / "tests" / "test_probes.py").write_text(PROBES, encoding="utf-8")

    done, outcomes = pytest_in(copy, tmp_path / "as-shipped.xml", "tests/test_probes.py")
    guard = "read the user's stack file(s)"
    for name, read in [("test_reads_in_its_own_process", "Pulumi.test.yaml"),
                       ("test_reads_through_a_python_child", "Pulumi.prod.yaml"),
                       ("test_reads_through_the_programs_cross_stack_check", "Pulumi.prod.yaml")]:
        outcome, message = outcomes[name]
        assert outcome == "failure" and guard in message and read in message, (name, outcomes[name], done.stdout[-3000:])
    assert outcomes["test_reads_the_fixtures_only"] == ("passed", "")
    assert outcomes["test_marked_reads_the_example"] == ("passed", ""), done.stdout[-3000:]

    # The user edits a stack file: the marked test is skipped, nothing else changes.
    path = copy / "Pulumi.test.yaml"
    path.write_text(path.read_text(encoding="utf-8") + "# mine now\n", encoding="utf-8")
    done, edited = pytest_in(copy, tmp_path / "edited.xml", "tests/test_probes.py")
    outcome, message = edited.pop("test_marked_reads_the_example")
    assert outcome == "skipped" and "Pulumi.test.yaml changed" in message, (outcome, message)
    assert {name: result[0] for name, result in edited.items()} == \
        {name: result[0] for name, result in outcomes.items() if name != "test_marked_reads_the_example"}

    # A read while the test modules are imported stops the run before any test.
    (copy / "tests" / "test_probes.py").unlink()
    (copy / "tests" / "test_import_probe.py").write_text(IMPORT_PROBE, encoding="utf-8")
    done, outcomes = pytest_in(copy, tmp_path / "import.xml", "tests/test_import_probe.py")
    assert done.returncode != 0 and not outcomes
    assert "importing the test modules (collection) read the user's stack file(s) Pulumi.test.yaml" in done.stderr


# --- 2. the newcomer paths ------------------------------------------------------------------------


def stack_config(root: Path, stack: str) -> dict:
    return yaml.safe_load((root / f"Pulumi.{stack}.yaml").read_text(encoding="utf-8"))["config"]


def write_stack_config(root: Path, stack: str, config: dict) -> None:
    (root / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False), encoding="utf-8")


def merge(base, snippet):
    """A snippet applied as the docs mean it: maps merge key by key, a list of named items gains
    the snippet's items (one of the same name replaced), any other value is replaced."""
    if isinstance(base, dict) and isinstance(snippet, dict):
        return {**base, **{key: merge(base.get(key), value) for key, value in snippet.items()}}
    if isinstance(base, list) and isinstance(snippet, list) and all(isinstance(i, dict) and "name" in i for i in snippet):
        names = {item["name"] for item in snippet}
        return [item for item in base if not (isinstance(item, dict) and item.get("name") in names)] + snippet
    return snippet


def section(path: Path, title: str) -> str:
    text = path.read_text(encoding="utf-8")
    assert f"\n{title}\n" in text, f"{path.name} has no section {title!r}"
    return text.split(f"\n{title}\n", 1)[1].split("\n## ", 1)[0]


def snippets(path: Path, title: str) -> list[dict]:
    """The YAML snippets of a docs section, in order."""
    return [yaml.safe_load(_dedent_block(block)) for block in _code_blocks(section(path, title), "yaml")]


def readme_entity() -> dict:
    """The entity of entities/README.md, "Adding your own entity", step 3."""
    [entity] = [item for snippet in snippets(ROOT / "entities" / "README.md", "## Adding your own entity")
                for item in snippet]
    return entity


def add_entity_directory(copy: Path, test: dict, entity: dict, dockerfile: bool = True) -> None:
    """The entity's directory as entities/README.md says: a copy of one of the same kind and language."""
    target = copy / entity["source"]
    assert not target.exists(), f"{entity['source']} exists already: pick another name"
    [like] = [copy / e["source"] for p in test["cloudstation:projects"] for e in p["entities"]
              if (e["kind"], e["language"]) == (entity["kind"], entity["language"])
              and (copy / e["source"] / "Dockerfile").is_file()][:1]
    shutil.copytree(like, target, ignore=shutil.ignore_patterns("node_modules"))
    if not dockerfile:
        (target / "Dockerfile").unlink()


def project_of(config: dict, name: str) -> dict:
    [project] = [p for p in config["cloudstation:projects"] if p["name"] == name]
    return project


def entity_test_first(copy: Path, test: dict, prod: dict) -> None:
    """entities/README.md: the entity into its project in Pulumi.test.yaml, then `bash scripts/test.sh`
    (prod gets it once test deployed it)."""
    entity = readme_entity()
    add_entity_directory(copy, test, entity)
    project_of(test, entity["source"].split("/")[1])["entities"].append(dict(entity))


def entity_prod_first(copy: Path, test: dict, prod: dict) -> None:
    """An entity added to Pulumi.prod.yaml first (without `image:`), the other order: test lacks it."""
    entity = {"name": "returns", "kind": "replicated", "language": "javascript", "source": "entities/shop/returns"}
    add_entity_directory(copy, test, entity)
    project_of(prod, "shop")["entities"].append(dict(entity))


def entity_in_both(copy: Path, test: dict, prod: dict) -> None:
    """An entity added to both stack files at once (prod without `image:`, docs/operations.md step 4)."""
    entity = {"name": "wishlist", "kind": "replicated", "language": "javascript", "source": "entities/shop/wishlist"}
    add_entity_directory(copy, test, entity)
    for config in (test, prod):
        project_of(config, "shop")["entities"].append(dict(entity))


def project(copy: Path, test: dict, prod: dict) -> None:
    """docs/operations.md "Add a project or an entity": its Pulumi.test.yaml snippets in order (the
    project, then the operator's watch list), the entity without a Dockerfile, and the same
    project in Pulumi.prod.yaml without `image:`."""
    found = snippets(ROOT / "docs" / "operations.md", "## Add a project or an entity")
    assert found and all(set(s) <= {"cloudstation:projects", "cloudstation:platform"} for s in found), found
    [new] = [p for snippet in found for p in snippet.get("cloudstation:projects", [])]
    [entity] = new["entities"]
    add_entity_directory(copy, test, entity, dockerfile=False)
    merged = test
    for snippet in found:
        merged = merge(merged, snippet)
    test.clear()
    test.update(merged)
    prod["cloudstation:projects"].append({**new, "entities": [dict(entity)]})


def store_cassandra(copy: Path, test: dict, prod: dict) -> None:
    """A project switched to `store: cassandra` in both stack files (docs/cloudstate.md); prod's
    entity pods then run the Cassandra proxy, which has no digest recorded yet: named in prod's
    opt-out as the refusal says (docs/security.md, "Images"), where the lab cluster has one."""
    for config in (test, prod):
        project_of(config, "shop")["store"] = "cassandra"
    listed = (prod["cloudstation:platform"].get("images") or {}).get("allowUnpinned")
    if listed is not None and "cloudstate-proxy-cassandra" not in listed and versions.digest_of(
            versions.image("cloudstate-proxy-cassandra")) is None:
        listed.append("cloudstate-proxy-cassandra")


def external_postgres(copy: Path, test: dict, prod: dict) -> None:
    """docs/operations.md "Use external stores": its PostgreSQL section in Pulumi.test.yaml, in place
    of the managed one (whose keys an external store does not take)."""
    [snippet] = snippets(ROOT / "docs" / "operations.md", "## Use external stores")
    test["cloudstation:platform"]["stores"]["postgres"] = snippet["cloudstation:platform"]["stores"]["postgres"]


def scale_up(copy: Path, test: dict, prod: dict) -> None:
    """Prod's entities scaled up: `replicas: 2` (docs/cloudstate.md, "Sizing")."""
    for entity in project_of(prod, "shop")["entities"]:
        entity["replicas"] = 2


PATHS: dict[str, Callable[[Path, dict, dict], None]] = {
    "entity-test-first": entity_test_first,
    "entity-prod-first": entity_prod_first,
    "entity-in-both": entity_in_both,
    "project": project,
    "store-cassandra": store_cassandra,
    "external-postgres": external_postgres,
    "prod-replicas-2": scale_up,
}

MODULES = [
    # What these edits failed before the suite moved to its fixture stacks (each path applied to the
    # tree of ff4c445): the README diagram and the example's cluster budget (example facts now,
    # skipped here), the stores, environments and network policies of both stack files, the
    # replicated variant, the stack-file checks (which read the root's text), the entities (at
    # collection: promoting a test-first entity refused) and the availability and Armada budget
    # checks of the example.
    "tests/test_docs.py",
    "tests/test_cluster_fit.py",
    "tests/test_armada_fit.py",
    "tests/test_availability.py",
    "tests/test_stores.py",
    "tests/test_project_environments.py",
    "tests/test_network_policies.py",
    "tests/test_entities.py",
    "tests/test_stack_file_errors.py",
]
"""The modules run in the edited copy: every module that failed on these edits before, and
with them every kind of `example_stacks` test."""


def apply(copy: Path, names) -> None:
    """The paths `names`, in order, applied to the stack files at `copy`'s root."""
    test, prod = stack_config(copy, "test"), stack_config(copy, "prod")
    for name in names:
        PATHS[name](copy, test, prod)
    write_stack_config(copy, "test", test)
    write_stack_config(copy, "prod", prod)


@pytest.fixture(scope="module")
def example_copy(tmp_path_factory) -> Path:
    """A copy of the repository with the example stack files at its root, as a fresh clone has them:
    a git work tree whose HEAD is the example (`check` compares a store switch with HEAD)."""
    copy = stacks.copy_repository(tmp_path_factory.mktemp("clone") / "repo")
    for stack in ("test", "prod"):
        shutil.copy(ROOT / f"Pulumi.{stack}.yaml", copy / f"Pulumi.{stack}.yaml")
    git = ["git", "-c", "user.name=cloudstation-tests", "-c", "user.email=tests@cloudstation.invalid"]
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the example"]):
        subprocess.run(git + argv, cwd=copy, check=True, capture_output=True, timeout=120)
    return copy


RENDER_AND_PROMOTE = """
import json, sys
from pathlib import Path
from cloudstation_tools import promote, render
root = Path.cwd()
test = render.render("test", root)
images = dict(test.outputs[promote.IMAGES_OUTPUT])
services = lambda r: sorted(o["metadata"]["name"] for o in r.manifests() if o["kind"] == "StatefulService")
try:
    text = promote.first_promotion_text(root, images, "test", "prod")
except promote.PromotionRefused as refused:
    print(json.dumps({"test": services(test), "refused": str(refused)}))
    sys.exit(0)
(root / "Pulumi.prod.yaml").write_text(text, encoding="utf-8")
print(json.dumps({"test": services(test), "prod": services(render.render("prod", root))}))
"""
"""Run in a copy with its own code (the program finds entity sources from its own location): render
test, promote its images into prod as `python -m infra promote` writes them, render prod."""


def services_of(config: dict) -> set[str]:
    return {f"{p['name']}-{e['name']}" for p in config["cloudstation:projects"] for e in p["entities"]}


def entities_of(config: dict) -> set[str]:
    return {f"{p['name']}/{e['name']}" for p in config["cloudstation:projects"] for e in p["entities"]}


OVER_BUDGET = {"store-cassandra", "prod-replicas-2"}
"""The paths whose pods no longer fit the example's cluster budget (3 CPU, 6 GiB: a setting of the
user's, `platform.clusterBudget`): `check` says so as an error with the fix (the example's two
stacks request 5.9 GiB before; a Cassandra per stack or prod's doubled entity pods go over it).
`project` follows docs/operations.md, whose snippets raise the budget with the project."""
LEFT_TO_DO = {
    # The managed stores a switch leaves behind (compared with the clone's HEAD): their claims stay.
    "store-cassandra": [("warning", "data", "cloudstation:projects[0].store",
                         "goes away: project shop's postgres store (its store is now cassandra)")] * 2,  # both stacks
    "external-postgres": [("notice", "clusters", "cloudstation:platform.stores.postgres.credentialsSecret",
                           "which no stack in this folder deploys: create it before `pulumi up`"),
                          ("warning", "data", "cloudstation:platform.stores.postgres.mode",
                           "goes away: project shop's managed postgres (PersistentVolumeClaim shop-test/")],
}
"""What `check` says is left besides the promotion steps and the budget, by path."""


def left_to_do(name: str, test: dict, prod: dict) -> list[tuple[str, str, str, str]]:
    """(severity, check, key, a piece of the message) of each finding `check` should report after `name`:
    the example's prod was never promoted (a notice); an entity in one stack only is named, with
    what to do (the first promotion refuses it); the budget where the path exceeds it."""
    found = [("notice", "promotion", "cloudstation:projects", "Pulumi.prod.yaml was never promoted: deploy test")]
    found += [("notice", "promotion", "cloudstation:projects[0]",
               f"{key} is in Pulumi.test.yaml and not in Pulumi.prod.yaml: add it here without `image:`")
              for key in sorted(entities_of(test) - entities_of(prod))]
    found += [("notice", "promotion", "cloudstation:projects[0].entities[",
               f"{key} has no image in Pulumi.prod.yaml yet (prod cannot deploy it): add it to Pulumi.test.yaml")
              for key in sorted(entities_of(prod) - entities_of(test))]
    if name in OVER_BUDGET:
        found.append(("error", "budget", "cloudstation:platform.clusterBudget",
                      "lower replicas or sizes, or set clusterBudget to what the cluster can allocate"))
    return found + LEFT_TO_DO.get(name, [])


@pytest.mark.example_stacks  # the paths start from the example stack files
@pytest.mark.parametrize("name", list(PATHS))
def test_each_newcomer_path_renders_and_check_says_what_is_left(example_copy, tmp_path, name):
    copy = tmp_path / "repo"
    shutil.copytree(example_copy, copy, symlinks=True)
    apply(copy, [name])
    test, prod = stack_config(copy, "test"), stack_config(copy, "prod")
    # `cloudstation check` (the copy's own) reports exactly what is left to do, each with file and line.
    done = run(copy, "-m", "infra", "check", "--format", "json", timeout=300)
    report = json.loads(done.stdout)
    expected = left_to_do(name, test, prod)
    assert done.returncode == report["exitCode"] == (1 if any(e[0] == "error" for e in expected) else 0), done.stdout
    findings = report["findings"]
    assert len(findings) == len(expected), json.dumps(findings, indent=1)
    for severity, check, key, text in expected:
        matching = [f for f in findings if (f["severity"], f["check"]) == (severity, check) and f["key"].startswith(key)
                    and text in f["message"] and f["line"]]
        assert len(matching) >= expected.count((severity, check, key, text)), \
            (severity, check, key, text, json.dumps(findings, indent=1))

    # Rendered, and promoted as `python -m infra promote` would write prod (into the copy).
    done = run(copy, "-c", RENDER_AND_PROMOTE, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert services_of(test) <= set(result["test"])
    one_stack_only = entities_of(test) ^ entities_of(prod)
    if one_stack_only:  # promote refuses, naming each; the user adds it to the other stack
        assert all(entity in result["refused"] for entity in one_stack_only), result
    else:
        assert services_of(prod) <= set(result["prod"]), result


@pytest.mark.example_stacks  # the paths start from the example stack files
def test_every_newcomer_path_at_once_leaves_the_suite_green(example_copy, tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(example_copy, copy, symlinks=True)
    apply(copy, list(PATHS))
    assert user_files.edited_example(copy) == ["Pulumi.prod.yaml changed", "Pulumi.test.yaml changed"]

    # The whole suite still collects (it collected nothing when an import read the stack files).
    done = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--collect-only", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    done, outcomes = pytest_in(copy, tmp_path / "report.xml", *MODULES, timeout=900)
    failed = sorted(name for name, (outcome, _) in outcomes.items() if outcome in ("failure", "error"))
    assert done.returncode == 0 and failed == [], (failed, done.stdout[-5000:])
    skipped = {name: message for name, (outcome, message) in outcomes.items() if outcome == "skipped"}
    assert skipped and all("not the example recorded" in message for message in skipped.values()), skipped
    assert {"test_readme_diagram_names_every_namespace_of_both_stacks",
            "test_both_example_stacks_together_fit_a_developers_cluster"} <= set(skipped)
    # The user's own entities are among the checked ones (entities/ is read, not the stack files).
    for source in ("entities/shop/checkout", "entities/shop/returns", "entities/shop/wishlist", "entities/inventory/stock"):
        checked = [name for name, (outcome, _) in outcomes.items() if f"[{source}]" in name and outcome == "passed"]
        assert len(checked) >= 5, (source, checked)
    assert sum(outcome == "passed" for outcome, _ in outcomes.values()) > 250


@pytest.mark.example_stacks  # the edit starts from the example stack files
def test_a_store_switch_as_written_is_reported_in_one_round(example_copy, tmp_path):
    """`store: cassandra` in both files and nothing else, as docs/cloudstate.md says it: prod's entity
    pods would then run the Cassandra proxy, whose pin may have no digest (a config error of prod's
    opt-out), and the same report already has what only the render shows: the cluster over its
    budget, and the claims the switch leaves behind in both stacks (it came in two rounds)."""
    copy = tmp_path / "repo"
    shutil.copytree(example_copy, copy, symlinks=True)
    test, prod = stack_config(copy, "test"), stack_config(copy, "prod")
    for config in (test, prod):
        project_of(config, "shop")["store"] = "cassandra"
    write_stack_config(copy, "test", test)
    write_stack_config(copy, "prod", prod)

    done = run(copy, "-m", "infra", "check", "--format", "json", timeout=300)
    findings = json.loads(done.stdout)["findings"]
    found = sorted((f["severity"], f["check"], f["file"], f["key"]) for f in findings if f["severity"] != "notice")
    expected = [("error", "budget", "Pulumi.test.yaml", "cloudstation:platform.clusterBudget"),
                ("warning", "data", "Pulumi.prod.yaml", "cloudstation:projects[0].store"),
                ("warning", "data", "Pulumi.test.yaml", "cloudstation:projects[0].store")]
    if versions.digest_of(versions.image("cloudstate-proxy-cassandra")) is None:
        expected.append(("error", "config", "Pulumi.prod.yaml", "cloudstation:platform.images.allowUnpinned"))
    assert (done.returncode, found) == (1, sorted(expected)), json.dumps(findings, indent=1)
    unpinned = [f for f in findings if f["key"] == "cloudstation:platform.images.allowUnpinned"]
    assert all("cloudstate-proxy-cassandra" in f["message"] and f["line"] for f in unpinned), unpinned
