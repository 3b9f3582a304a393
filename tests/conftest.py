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

from tests import user_files  # noqa: E402

# From here on, every read of a root stack file is some test's (tests/user_files.py): test modules
# are imported below this line, at collection.
user_files.install(ROOT)

from cloudstation_tools import checks  # noqa: E402
from cloudstation_tools import render as render_module  # noqa: E402
from cloudstation_tools.checks import pod_spec  # noqa: E402,F401  (re-exported for the tests)
from infra.config import PROJECT  # noqa: E402
from cloudstation_tools.mocks import ProgramMocks, RecordingMonitor  # noqa: E402
from tests import stacks  # noqa: E402
from tests.registry_server import registry  # noqa: E402,F401  (a fixture, shared by the registry tests)

STACKS = list(stacks.BASE)
"""The base fixture pair (tests/stacks/Pulumi.test.yaml, Pulumi.prod.yaml)."""


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", f"{user_files.MARKER}: checks a fact about the repository's own example stack files (the root's "
                   "Pulumi.<stack>.yaml); runs only while they are the example as recorded in "
                   "tests/stacks/example.sha256, is skipped once the user edited them, and runs after the unmarked "
                   "tests (of its module, when scripts/test.sh spreads modules over processes; tests/user_files.py)")


def pytest_unconfigure(config) -> None:
    user_files.uninstall()


def pytest_collection_modifyitems(session, config, items) -> None:
    """A read of a user stack file while the test modules were imported is no test's: fail at once.
    Tests marked `example_stacks` run after the unmarked ones (with `-n --dist loadfile`, after those
    of their module), so that what they read (and a cache may keep) is not what an unmarked test sees."""
    read = user_files.unattributed()
    if read:
        raise pytest.UsageError(user_files.problem("importing the test modules (collection)", read, ROOT))
    items.sort(key=lambda item: item.get_closest_marker(user_files.MARKER) is not None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    if item.get_closest_marker(user_files.MARKER):
        user_files.running(item.nodeid)
        edited = user_files.edited_example(ROOT)
        if edited:
            pytest.skip(f"the root stack files are not the example recorded in tests/stacks/example.sha256 "
                        f"({'; '.join(edited)}): this checks a fact about the example, not about your stacks")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    user_files.running(item.nodeid)
    try:
        yield
    finally:
        user_files.running(None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "setup" and report.passed:
        return  # the call's report says it, with whatever the call reads too
    read = user_files.reads_of(item.nodeid)
    if read and not item.get_closest_marker(user_files.MARKER):
        report.outcome = "failed"
        report.longrepr = user_files.problem(item.nodeid, read, ROOT)


@pytest.fixture(scope="session")
def rendered_stacks() -> dict[str, render_module.Rendered]:
    """The base fixture pair (tests/stacks/), each run through the program (__main__.py) once per
    test process: test, then prod as promoting test's `images` output writes it."""
    return {stack: stacks.rendered(stack) for stack in STACKS}


@pytest.fixture(params=STACKS)
def rendered(request, rendered_stacks) -> render_module.Rendered:
    """Parametrises a test over the base fixture pair."""
    return rendered_stacks[request.param]


@pytest.fixture(scope="session")
def example_rendered() -> dict[str, render_module.Rendered]:
    """The repository's own example stack files (the root's Pulumi.test.yaml and Pulumi.prod.yaml,
    the user's to edit), rendered: test, then prod as its first promotion writes it. Only for tests
    marked `example_stacks`, which run last and only while those files are the example (tests/user_files.py)."""
    import tempfile

    from cloudstation_tools import promote

    test = render_module.render("test", ROOT)
    text = promote.first_promotion_text(ROOT, dict(test.outputs[promote.IMAGES_OUTPUT]), "test", "prod")
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "Pulumi.prod.yaml").write_text(text, encoding="utf-8")
        prod_file = render_module.StackFile.read("prod", Path(directory))
    return {"test": test, "prod": render_module.render("prod", ROOT, stack_file=prod_file)}


@pytest.fixture(scope="session")
def fixture_project(tmp_path_factory) -> Path:
    """A copy of the repository whose stack files are the base fixture pair (tests/stacks/, prod
    never promoted): where tests run the command line (`python -m infra ...` reads the stack files
    of the directory it runs in). Tests must not change it."""
    return stacks.copy_repository(tmp_path_factory.mktemp("fixture-project") / "repo")


@pytest.fixture(params=stacks.ARMADA_STACKS)
def armada_rendered(request) -> render_module.Rendered:
    """Parametrises a test over the fixtures that run an Armada (one per cluster, docs/armada.md):
    the base test stack, and prod on a cluster of its own (tests/stacks/)."""
    return stacks.rendered(request.param)


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


def validation_problems(rendered: render_module.Rendered, extra_crds=()) -> list[str]:
    """Schema problems of every object (Secrets with their keys, see `manifests`)."""
    from cloudstation_tools.validate import SUPPORTED_VERSIONS, validate_all

    # The oldest and newest supported versions (every one is checked on the base pair).
    versions = [SUPPORTED_VERSIONS[0], SUPPORTED_VERSIONS[-1]]
    return validate_all(manifests(rendered.registrations), versions=versions, extra_crds=extra_crds)


def manifests(registrations) -> list[dict]:
    """The Kubernetes objects as `Rendered.manifests()` shows them, except that a Secret's
    `stringData`/`data` (pulumi-kubernetes makes each secret as a whole) keeps its keys, with
    every value redacted; so schema checks see an object and tests see which keys exist."""
    from cloudstation_tools.mocks import is_wrapped_secret
    from cloudstation_tools.render import SECRET, apply_order, canonical, clean

    result = []
    for registration in registrations:
        if not (registration.custom and registration.type.startswith("kubernetes:")) or "/" not in registration.type:
            continue
        inputs = dict(registration.inputs)
        for field in ("stringData", "data"):
            value = inputs.get(field)
            if is_wrapped_secret(value) and isinstance(value["value"], dict):
                inputs[field] = {key: SECRET for key in value["value"]}
        result.append(canonical(clean(inputs)))
    return sorted(result, key=apply_order)


def build(mocked, make) -> list[dict]:
    """Run `make()` (registers components) under mocks; the Kubernetes objects it registered."""
    run_mocked(make)
    return manifests(mocked.registrations)
