"""Issue 21's newcomer findings ("Why"), each fixed with a test: commands that failed on a fresh clone,
and docs that described an older program."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import yaml

from cloudstation_tools import check, preflight, stack_file
from tests import stacks
from tests.conftest import ROOT
from tests.test_check import edit, project  # noqa: F401  (a fixture)
from tests.test_up_script import BASH, Sandbox

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


# --- commands --------------------------------------------------------------------------------------


def test_port_forwards_of_prod_before_its_first_promotion(fixture_project):
    """Prod needs no port-forward, promoted or not: it must not fail with the "never promoted" error."""
    slots = stack_file.image_slots((fixture_project / "Pulumi.prod.yaml").read_text(encoding="utf-8"))
    assert all(slot.value is None for slot in slots.values())  # the fixture prod (as the example): never promoted
    done = subprocess.run([sys.executable, "-m", "infra", "port-forwards", "--stack", "prod"], cwd=fixture_project,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (done.stdout, done.stderr) == ("", ""), done.stderr


def _has_pulumi(python: str) -> bool:
    return subprocess.run([python, "-c", "import pulumi"], capture_output=True).returncode == 0


@pytest.mark.skipif(SYSTEM_PYTHON is None or _has_pulumi(SYSTEM_PYTHON),
                    reason="needs a python3 outside the virtualenv, without the program's requirements")
def test_python_m_infra_works_after_env_sh(tmp_path):
    """The docs write `python -m infra ...` after `source scripts/env.sh`: the `python` found first must
    be the project's virtualenv, not a system Python without pulumi (ModuleNotFoundError)."""
    sandbox = Sandbox(tmp_path)
    (sandbox.bin / "python").symlink_to(SYSTEM_PYTHON)  # what `python` is on a fresh machine
    done = subprocess.run([BASH, "-c", "source scripts/env.sh && python -m infra port-forwards --stack test"],
                          cwd=sandbox.repo, env=sandbox.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert lines and all(len(line) == 3 for line in lines), done.stdout  # `namespace service local:remote`
    assert "scripts/env.sh: PATH" in done.stderr  # says what it changed
    # And from any directory: the script finds the project's .venv by its own path.
    done = subprocess.run([BASH, "-c", f"cd / && source {sandbox.repo}/scripts/env.sh && command -v python"],
                          env=sandbox.env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == str(sandbox.repo / ".venv" / "bin" / "python"), done.stderr


# --- an external registry switches builds to local: said, not silent --------------------------------


def test_an_external_registry_says_builds_run_locally(project):  # noqa: F811
    def external(config):
        platform = config["cloudstation:platform"]
        platform["registry"] = {"mode": "external", "url": "registry.example.com/cloudstation", "username": "ci"}
        config["cloudstation:registryPassword"] = {"secure": "v1:abc"}
    text = edit(project, "test", external)
    report = check.run(project, stack="test")
    [notice] = [f for f in report.findings if f.check == "builds"]
    assert notice.severity == "notice" and notice.key == "cloudstation:platform.registry.mode"
    assert notice.line == next(i for i, line in enumerate(text.splitlines(), 1) if "mode: external" in line)
    assert "builds.mode: local" in notice.message and "Docker engine" in notice.message
    # Chosen explicitly, nothing to say.
    edit(project, "test", lambda c: c["cloudstation:platform"].__setitem__("builds", {"mode": "local"}))
    assert [f for f in check.run(project, stack="test").findings if f.check == "builds"] == []


def test_preflight_says_why_the_stack_needs_docker(tmp_path):
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    for folder in ("entities", "tests/stacks/entities"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("node_modules"))
    config = yaml.safe_load((stacks.DIR / "Pulumi.test.yaml").read_text())["config"]  # the fixture's
    config["cloudstation:platform"]["registry"] = {"mode": "external", "url": "registry.example.com/cs", "username": "ci"}
    config["cloudstation:registryPassword"] = {"secure": "v1:abc"}
    (tmp_path / "Pulumi.test.yaml").write_text(yaml.safe_dump({"config": config}))
    report = preflight.check("test", tmp_path, env={"PATH": ""}, which=lambda tool: None,
                             runner=lambda argv: None)
    [docker] = [p.what for p in report.problems if p.what.startswith("docker:")]
    assert "platform.builds.mode: local" in docker and "registry.mode: external" in docker, docker


# --- stale docs -----------------------------------------------------------------------------------


def _sentences(text: str) -> list[str]:
    flat = re.sub(r"\s*\n\s*", " ", text)
    return [s.strip() for s in re.split(r"(?<=[.:;|])\s+(?=[A-Z`(|-])", flat)]


DOCKER_DOCS = [ROOT / "README.md", ROOT / "docs" / "operations.md", ROOT / "docs" / "registry.md",
               ROOT / ".github" / "workflows" / "ci.yml"]


@pytest.mark.parametrize("path", DOCKER_DOCS, ids=lambda p: p.name)
def test_docs_do_not_say_the_default_builds_need_docker(path):
    """Entity images are built in the cluster by default (platform.builds.mode: armada, docs/builds.md):
    a sentence that has entity images built by a Docker engine or pulumi-docker says it is the local mode."""
    stale = [s for s in _sentences(path.read_text(encoding="utf-8"))
             if re.search(r"Docker engine|pulumi-docker|docker\.Image", s) and re.search(r"[Bb]uil[dt]", s)
             and not re.search(r"local|[Nn]o Docker engine|without a Docker|Docker engine or network", s)]
    assert not stale, "\n".join(stale)


def test_docs_list_no_cloudstate_cluster_role():
    """The operator has no ClusterRole (docs/cloudstate.md, "What the operator may do"); the cluster-scoped
    objects the docs list for CloudState are its CRDs only."""
    for path in (ROOT / "README.md", ROOT / "docs" / "cloudstate.md"):
        stale = [s for s in _sentences(path.read_text(encoding="utf-8"))
                 if re.search(r"CloudState CRDs(,| and) ClusterRole|CRDs, ClusterRoles?,? (and )?(the )?operator|"
                              r"CRDs, ClusterRole and ClusterRoleBinding|config keys, ClusterRole", s)]
        assert not stale, f"{path.name}: " + "\n".join(stale)


@pytest.mark.example_stacks  # the docs' table and diagram describe the example stack files
def test_docs_name_every_queue_the_test_stack_manages(example_rendered):
    queues = example_rendered["test"].outputs["armadaQueues"]
    assert "platform-builds" in queues
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    [row] = [line for line in operations.splitlines() if line.startswith("| `armadaQueues`")]
    assert all(f'"{queue}"' in row for queue in queues), row
    assert "platform-builds" in row
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    [diagram] = [line for line in readme.splitlines() if "queues research" in line]
    assert all(queue in diagram for queue in queues), diagram
