"""Shared fixtures: the real program rendered per stack file under mocks, and a mock harness
for testing one component alone. Both use a fresh MockMonitor per run and preview=False.
Also the test registry server (`registry`), fake AWS credentials (`aws_env`), and helpers to
find rendered objects and check workloads against the team's standards."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Iterator, Optional

import pulumi
import pulumi.runtime.settings
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cloudstation_tools import checks  # noqa: E402
from cloudstation_tools import render as render_module  # noqa: E402
from cloudstation_tools.checks import pod_spec  # noqa: E402,F401  (re-exported for the tests)
from infra.config import PROJECT  # noqa: E402
from cloudstation_tools.mocks import ProgramMocks, RecordingMonitor  # noqa: E402
from tests import armada_variants, promoted  # noqa: E402
from tests.registry_server import registry  # noqa: E402,F401  (a fixture, shared by the registry tests)

STACKS = ["test", "prod"]


def pytest_configure(config) -> None:
    # tests/test_user_copy.py runs the suite's checks on a copy with a user's own projects and
    # deselects these: facts about the repository's own example stack files (README's diagram,
    # the example stacks' cluster budget), which a user's additions rightly change.
    config.addinivalue_line("markers", "example_stacks: checks a fact about the repository's own example stack files")


@pytest.fixture(scope="session")
def rendered_stacks() -> dict[str, render_module.Rendered]:
    """Each stack file in the repo, run through the program (__main__.py) once per test session: test from
    its file, then prod from Pulumi.prod.yaml as promoting test's `images` output writes it (the
    repository's prod file has no images before a first promotion; tests/promoted.py)."""
    return {stack: promoted.rendered(stack) for stack in STACKS}


@pytest.fixture(params=STACKS)
def rendered(request, rendered_stacks) -> render_module.Rendered:
    """Parametrises a test over both stack files."""
    return rendered_stacks[request.param]


@pytest.fixture(params=armada_variants.ARMADA_STACKS)
def armada_rendered(request, rendered_stacks) -> render_module.Rendered:
    """Parametrises a test over the stacks that run an Armada (one per cluster, docs/armada.md):
    the test stack file, and prod on a cluster of its own (tests/armada_variants.py)."""
    if request.param in rendered_stacks:
        return rendered_stacks[request.param]
    return armada_variants.variant(request.param)


@pytest.fixture
def aws_env(monkeypatch) -> None:
    """Fake AWS credentials and region for moto; no profile from the machine running the tests."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def mocked() -> Iterator[ProgramMocks]:
    """Mocks for building components directly inside a `@pulumi.runtime.test` function;
    `mocked.registrations` holds what they registered."""
    mocks = ProgramMocks()
    pulumi.runtime.settings.ROOT.set(None)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack="unit", preview=False, monitor=RecordingMonitor(mocks))
    yield mocks


def run_mocked(make: Callable[[], Optional[dict]]) -> dict:
    """Run `make()` (registers components under the `mocked` fixture) as a `@pulumi.runtime.test`
    program; the {name: Output} it returns, if any, resolved."""
    resolved: dict = {}

    @pulumi.runtime.test
    def program():
        outputs = make()
        return pulumi.Output.all(**(outputs if isinstance(outputs, dict) else {})).apply(resolved.update)

    program()
    return resolved


def objects(rendered: render_module.Rendered, kind: Optional[str] = None) -> list[dict]:
    return [o for o in rendered.manifests() if kind is None or o["kind"] == kind]


def find(rendered: render_module.Rendered, kind: str, name: str, namespace: Optional[str] = None) -> dict:
    matches = [
        o
        for o in objects(rendered, kind)
        if o["metadata"].get("name") == name and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    assert len(matches) == 1, f"expected one {kind} {namespace}/{name}, found {len(matches)}"
    return matches[0]


def container(spec: dict, name: str) -> dict:
    """The one container (or init container) of a pod spec with that name."""
    [match] = [c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == name]
    return match


# The restricted Pod Security Standard, requests and limits, pinned images, no credentials in literal env.
WORKLOAD_CHECKS = (checks.restricted_violations, checks.resource_violations, checks.image_violations,
                   checks.secret_env_violations)


def spec_violations(name: str, spec: dict) -> list[str]:
    """What `WORKLOAD_CHECKS` find wrong in one pod spec."""
    return [p for check in WORKLOAD_CHECKS for p in check(name, spec)]


def standard_violations(objects: list[dict]) -> list[str]:
    """What `WORKLOAD_CHECKS` find wrong in every workload among `objects`."""
    return [p for name, spec in checks.workloads(objects) for p in spec_violations(name, spec)]


def create_in_provider_process(serialized: str, props: dict) -> dict:
    """`create` of a pickled dynamic provider, run as Pulumi's dynamic-provider process runs it: a
    fresh interpreter started in the program's directory (infra/), where `components` is not
    importable (components/dynamic_provider.py). Returns {"id": ..., "outs": ...}."""
    import json
    import os
    import subprocess

    script = (
        "import base64, json, sys, dill\n"
        "assert 'components' not in sys.modules\n"
        "provider = dill.loads(base64.b64decode(sys.argv[1]))\n"
        "result = provider.create(json.loads(sys.argv[2]))\n"
        "print(json.dumps({'id': result.id, 'outs': result.outs}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", script, serialized, json.dumps(props)],
                            cwd=ROOT / "infra", env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
