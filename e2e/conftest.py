"""The end-to-end tier's pytest setup (run by scripts/e2e.sh, never by the unit suite: pyproject's
testpaths is tests/).

`--tools` names e2e/build-tools.sh's output, `--kubernetes` the Kubernetes builds to run on (comma-
separated tool names). Every test module runs once per Kubernetes version against one `platform`
(e2e/platform.py), modules in name order (test_scenario.py, test_security.py, test_upgrades.py) and
tests in file order: the scenario's steps build on each other, so a step whose prerequisite failed
(`@pytest.mark.after(...)`, by function name) fails at once ("not run") instead of obscurely. The last line of the
run is `e2e: N passed, M failed`; a per-step table of wall times comes before it.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest

from e2e.platform import Platform, read_tools, versions_run

_outcomes: dict[str, str] = {}  # nodeid -> passed | failed
_durations: list[tuple[str, str, float]] = []


def pytest_addoption(parser):
    parser.addoption("--tools", required=True, help="file with e2e/build-tools.sh's output (tool=bin dir lines)")
    parser.addoption("--kubernetes", required=True, help="comma-separated tool names, e.g. kubernetes-1.37")
    parser.addoption("--keep", action="store_true", help="leave the work directory (cluster logs, state)")
    parser.addoption("--summary", help="also write the `e2e: N passed, M failed` line to this file")


def pytest_configure(config):
    config.addinivalue_line("markers", "after(*steps): the test functions this step needs to have passed")


def pytest_generate_tests(metafunc):
    if "kubernetes" in metafunc.fixturenames:
        versions = [v for v in metafunc.config.getoption("--kubernetes").split(",") if v]
        metafunc.parametrize("kubernetes", versions, scope="session")


@pytest.fixture(scope="session")
def platform(request, kubernetes: str):
    tools = read_tools(Path(request.config.getoption("--tools")))
    work = Path(tempfile.mkdtemp(prefix=f"cloudstation-e2e-{kubernetes}-"))
    started = time.monotonic()
    instance = Platform(work, tools, kubernetes)
    try:
        instance.start()
        versions = versions_run(instance)
        print(f"\n[e2e {kubernetes}] started in {time.monotonic() - started:.1f} s; work dir {work}; "
              f"versions: {json.dumps(versions)}")
        (work / "versions.json").write_text(json.dumps(versions, indent=2))
        yield instance
    finally:
        instance.stop()
        if not request.config.getoption("--keep"):
            import shutil
            shutil.rmtree(work, ignore_errors=True)


def _step(item) -> str:
    return item.nodeid.split("::", 1)[1].split("[")[0] if "::" in item.nodeid else item.name


def _param(item) -> str:
    return item.callspec.params.get("kubernetes", "") if hasattr(item, "callspec") else ""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    marker = item.get_closest_marker("after")
    if marker is None:
        return
    version = _param(item)
    for needed in marker.args:  # a step of any module of the tier, on the same Kubernetes version
        outcome = next((o for node, o in _outcomes.items()
                        if _step_of(node) == needed and f"[{version}]" in node), None)
        if outcome != "passed":
            pytest.fail(f"not run: needs {needed} ({outcome or 'not run'})", pytrace=False)


def _step_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[1].split("[")[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and report.failed):
        _outcomes[item.nodeid] = "passed" if report.passed else "failed"
        _durations.append((_param(item), _step(item), report.duration))


def pytest_terminal_summary(terminalreporter):
    if _durations:
        terminalreporter.write_sep("-", "e2e steps (wall time)")
        for version, step, seconds in _durations:
            terminalreporter.write_line(f"{version:18} {step:50} {seconds:8.1f} s")
    passed = sum(1 for o in _outcomes.values() if o == "passed")
    failed = sum(1 for o in _outcomes.values() if o == "failed")
    line = f"e2e: {passed} passed, {failed} failed"
    terminalreporter.write_line(line)
    summary = terminalreporter.config.getoption("--summary")
    if summary:
        Path(summary).write_text(line + "\n")
