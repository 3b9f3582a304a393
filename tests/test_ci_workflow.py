"""The CI workflow's hardening (.github/workflows/ci.yml, docs/operations.md "CI"): actions pinned
by commit SHA with their release in a comment, checkouts without a persisted token, secrets only in
the env of the steps that use them, preview and deploy behind GitHub Environments, read-only
credentials for the preview, and no cache restored where credentials are."""
from __future__ import annotations

import re
from typing import Any, Iterator

import pytest
import yaml

from tests.conftest import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
SECRET = re.compile(r"\$\{\{\s*secrets\.(\w+)\s*\}\}")
ANY_SECRET = re.compile(r"secrets\.|secrets\[")
USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)(?P<comment>.*)$")
PINNED_USES = re.compile(r"(?P<action>[\w.-]+/[\w.-]+(?:/[\w./-]+)?)@(?P<sha>[0-9a-f]{40})")
VERSION_COMMENT = re.compile(r"\s+#\s*(?P<version>v[0-9]+\.[0-9]+\.[0-9]+)\s*")
ENVIRONMENTS = {"preview": "preview", "deploy": "production"}
PREVIEW_SHARED = {"PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "AWS_REGION"}
"""Secrets the preview shares with deploy: where the state is, the config passphrase, a region."""


def load(text: str) -> dict:
    data = yaml.safe_load(text)
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


@pytest.fixture
def workflow() -> dict:
    return load(WORKFLOW.read_text(encoding="utf-8"))


def walk(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """(path, string) of every string in the workflow."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from walk(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from walk(item, (*path, index))
    elif isinstance(value, str):
        yield path, value


def environment_name(job: dict) -> Any:
    environment = job.get("environment")
    return environment.get("name") if isinstance(environment, dict) else environment


# --- the checks, as functions so the tests can show each one failing -----------------------------


def unpinned_actions(text: str) -> list[str]:
    """`uses:` lines not pinned by a full commit SHA with a `# vX.Y.Z` comment; and an action
    pinned to two SHAs, or one SHA named as two versions."""
    problems, seen = [], {}
    for line in text.splitlines():
        match = USES_LINE.match(line)
        if not match:
            continue
        pinned, comment = PINNED_USES.fullmatch(match["ref"]), VERSION_COMMENT.fullmatch(match["comment"])
        if not pinned or not comment:
            problems.append(line.strip())
            continue
        seen.setdefault(pinned["action"], set()).add((pinned["sha"], comment["version"]))
    problems += [f"{action}: {sorted(pins)}" for action, pins in seen.items() if len(pins) > 1]
    return problems


def persisted_checkouts(workflow: dict) -> list[str]:
    return [
        f"{name} step {index}"
        for name, job in workflow["jobs"].items()
        for index, step in enumerate(job.get("steps") or [])
        if step.get("uses", "").startswith("actions/checkout@")
        and (step.get("with") or {}).get("persist-credentials") is not False
    ]


def misplaced_secrets(workflow: dict) -> list[str]:
    """Secrets anywhere but a step's `env` or `with` (workflow or job env, run scripts, conditions)."""
    problems = []
    for path, value in walk(workflow):
        if not ANY_SECRET.search(value):
            continue
        in_step = len(path) >= 6 and path[0] == "jobs" and path[2] == "steps" and path[4] in ("env", "with")
        if not in_step:
            problems.append(f"{'.'.join(map(str, path))}: {value}")
    return problems


def secrets_of(job: dict) -> set[str]:
    return {name for _, value in walk(job) for name in SECRET.findall(value)}


def cached_credentials(workflow: dict) -> list[str]:
    """Jobs that hold a secret and restore a cache (setup-* `cache`, actions/cache)."""
    problems = []
    for name, job in workflow["jobs"].items():
        if not secrets_of(job):
            continue
        for step in job.get("steps") or []:
            uses = step.get("uses", "")
            inputs = step.get("with") or {}
            if uses.startswith("actions/cache") or (uses.startswith("actions/setup-") and inputs.get("cache")) \
                    or (uses.startswith("actions/setup-node@") and inputs.get("package-manager-cache") is not False):
                problems.append(f"{name}: {uses}")
    return problems


# --- the workflow passes -------------------------------------------------------------------------


def test_every_action_is_pinned_by_commit_sha_with_its_release_in_a_comment():
    text = WORKFLOW.read_text(encoding="utf-8")
    assert len(re.findall(r"^\s*(?:-\s+)?uses:", text, flags=re.M)) >= 10
    assert unpinned_actions(text) == []


def test_checkouts_keep_no_token(workflow):
    assert any(s.get("uses", "").startswith("actions/checkout@") for j in workflow["jobs"].values() for s in j["steps"])
    assert persisted_checkouts(workflow) == []


def test_secrets_are_only_in_the_env_of_the_steps_that_use_them(workflow):
    assert "env" not in workflow
    assert [name for name, job in workflow["jobs"].items() if "env" in job] == []
    assert misplaced_secrets(workflow) == []
    # Every secret a step names is one it uses: in its `with`, or in its env and read by its
    # script or by the Pulumi CLI it runs (pulumi/actions, scripts/up.sh).
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            for key, value in (step.get("env") or {}).items():
                if SECRET.search(str(value)) and "run" in step and "scripts/up.sh" not in step["run"]:
                    assert f"${key}" in step["run"] or f"${{{key}}}" in step["run"], (step.get("name"), key)


def test_preview_and_deploy_run_in_environments_with_reviewers(workflow):
    jobs = workflow["jobs"]
    assert {name: environment_name(jobs[name]) for name in ENVIRONMENTS} == ENVIRONMENTS
    assert environment_name(jobs["test"]) is None and secrets_of(jobs["test"]) == set()
    section = OPERATIONS.read_text(encoding="utf-8").split("\n## CI\n", 1)[1].split("\n## ", 1)[0]
    environments = section.split("### Environments", 1)[1].split("\n### ", 1)[0]
    for environment in ENVIRONMENTS.values():
        [row] = [line for line in environments.splitlines() if line.startswith(f"| `{environment}` |")]
        assert "Required reviewers" in row, row
    assert "`main` only" in environments


def test_preview_uses_only_read_only_credentials(workflow):
    preview, deploy = secrets_of(workflow["jobs"]["preview"]), secrets_of(workflow["jobs"]["deploy"])
    credentials = preview - PREVIEW_SHARED
    assert credentials and all(name.startswith("PREVIEW_") for name in credentials)
    assert not credentials & deploy and not (deploy - PREVIEW_SHARED) & preview
    # Each preview credential is documented as read-only, and what read-only means is written down.
    section = OPERATIONS.read_text(encoding="utf-8").split("### Secrets", 1)[1].split("\n### ", 1)[0]
    for name in credentials:
        [row] = [line for line in section.splitlines() if line.startswith(f"| `{name}` |")]
        assert "read-only" in row or "its secret" in row, row
    meaning = OPERATIONS.read_text(encoding="utf-8").split("### What read-only means", 1)[1].split("\n### ", 1)[0]
    for fragment in ("s3:GetObject", "s3:ListBucket", "`get`, `list` and `watch`", "without\n  Secrets"):
        assert fragment in meaning, fragment


def test_jobs_with_credentials_restore_no_cache(workflow):
    assert cached_credentials(workflow) == []


def test_permissions_are_read_only_but_the_preview_comment(workflow):
    assert workflow["permissions"] == {"contents": "read"}
    writes = {name: {k: v for k, v in (job.get("permissions") or {}).items() if v == "write"}
              for name, job in workflow["jobs"].items()}
    assert writes == {"test": {}, "preview": {"pull-requests": "write"}, "deploy": {}}


def test_the_pulumi_steps_use_the_pinned_cli_and_the_pack_config(workflow):
    requirements = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    [sdk] = re.findall(r"^pulumi==([\d.]+)$", requirements, flags=re.M)
    actions = [s for job in workflow["jobs"].values() for s in job["steps"] if s.get("uses", "").startswith("pulumi/actions@")]
    assert len(actions) == 2 and {str(s["with"]["pulumi-version"]) for s in actions} == {sdk}
    [preview] = [s for s in actions if s["with"].get("command") == "preview"]
    assert preview["with"]["policyPackConfigs"] == "policy/config.json"
    assert (ROOT / "policy" / "config.json").is_file()
    deploy = workflow["jobs"]["deploy"]["steps"][-1]["run"]
    assert "--policy-pack policy --policy-pack-config policy/config.json" in deploy
    # Requirements are installed before the step that holds the deploy credentials.
    steps = workflow["jobs"]["deploy"]["steps"]
    install = next(i for i, s in enumerate(steps) if "pip install" in s.get("run", ""))
    assert all(not secrets_of(s) for s in steps[:install + 1])


def test_cloudstation_check_runs_on_every_pull_request_before_the_tests(workflow):
    """Issue 21: `cloudstation check` annotates each problem on its stack-file line; on a pull request it
    judges the data a change leaves behind against the base branch, which the checkout must fetch."""
    assert "pull_request" in workflow["on"]
    steps = workflow["jobs"]["test"]["steps"]
    [index] = [i for i, s in enumerate(steps) if "-m infra check" in s.get("run", "")]
    step = steps[index]
    assert "if" not in step and "--format github" in step["run"]
    assert '--against "origin/$BASE_REF"' in step["run"] and step["env"] == {"BASE_REF": "${{ github.base_ref }}"}
    tests = next(i for i, s in enumerate(steps) if s.get("run") == "bash scripts/test.sh")
    install = next(i for i, s in enumerate(steps) if "pip install" in s.get("run", ""))
    assert install < index < tests
    [checkout] = [s for s in steps if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"]["fetch-depth"] == 0


# --- each check catches what it is for -----------------------------------------------------------

OLD_STYLE = """
on: {push: {branches: [main]}}
env:
  TOKEN: ${{ secrets.TOKEN }}
jobs:
  deploy:
    runs-on: ubuntu-24.04
    env:
      AWS_ACCESS_KEY_ID: ${{ secrets.AWS_ACCESS_KEY_ID }}
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@a26af69be951a213d495a4c3e4e4022e16d87065
        with: {cache: pip}
      - uses: pulumi/actions@8e5e406f4007fca908480587cb9893c07090f58d # v7.0.0
      - uses: pulumi/actions@cc7494be991dba0978f7ffafaf995b0449a0998e # v6.5.0
      - run: echo "${{ secrets.KUBECONFIG_DATA }}" > kubeconfig
      - if: ${{ secrets.FLAG != '' }}
        run: true
"""


def test_the_checks_reject_an_unhardened_workflow():
    bad = load(OLD_STYLE)
    assert unpinned_actions(OLD_STYLE) == [
        "- uses: actions/checkout@v4",
        "- uses: actions/setup-python@a26af69be951a213d495a4c3e4e4022e16d87065",
        "pulumi/actions: [('8e5e406f4007fca908480587cb9893c07090f58d', 'v7.0.0'), "
        "('cc7494be991dba0978f7ffafaf995b0449a0998e', 'v6.5.0')]",
    ]
    assert persisted_checkouts(bad) == ["deploy step 0"]
    assert [p.split(":")[0] for p in misplaced_secrets(bad)] == [
        "env.TOKEN", "jobs.deploy.env.AWS_ACCESS_KEY_ID", "jobs.deploy.steps.4.run", "jobs.deploy.steps.5.if"]
    assert cached_credentials(bad) == ["deploy: actions/setup-python@a26af69be951a213d495a4c3e4e4022e16d87065"]
    assert environment_name(bad["jobs"]["deploy"]) is None
