"""Malformed stack files are refused with the file, the line or key, and the fix, never a traceback
(issue 12 item 6); a prod stack before its first promotion stops before any resource and names the
command to run (item 7). The same checks run in `python -m infra render` (a few cases run it as a
user does: exit 2) and in the program under the engine (config from PULUMI_CONFIG and
PULUMI_CONFIG_SECRET_KEYS, as the language host passes it). Expected lines are found in the texts,
not hard-coded."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Union

import pulumi
import pulumi.runtime.settings
import pytest
import yaml

from infra import config as stack_config
from infra import program, stack_yaml
from cloudstation_tools import render
from cloudstation_tools import stack_file as stack_file_edits
from infra import context as stack_context
from infra.config import ConfigError
from cloudstation_tools.mocks import ProgramMocks, RecordingMonitor
from tests import stacks
from tests.conftest import ROOT

TEST_TEXT = (stacks.DIR / "Pulumi.test.yaml").read_text(encoding="utf-8")
PROD_TEXT = (stacks.DIR / "Pulumi.prod.yaml").read_text(encoding="utf-8")
PROMOTE = "python -m infra promote --from test --to prod"


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    """1-based number of the line holding the `occurrence`-th `needle`."""
    lines = [number for number, line in enumerate(text.splitlines(), 1) if needle in line]
    return lines[occurrence - 1]


def refusal(tmp_path: Path, stack: str, content: Union[str, bytes]) -> str:
    """The ConfigError message `render` and `validate` give for this stack file (read, then the
    config validated like the program does); fails on any other exception."""
    path = tmp_path / f"Pulumi.{stack}.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    with pytest.raises(ConfigError) as caught:
        stack_file = render.StackFile.read(stack, tmp_path)
        stacks.load(stack_file.values, source=path.name, secret_keys=stack_file.secret_keys)
    message = str(caught.value)
    assert message.startswith(f"{path.name} has "), message
    return message


def _dedupe_projects(text: str) -> str:
    return text + "  cloudstation:projects: []\n"


def _nested_duplicate(text: str) -> str:
    return text.replace("      store: postgres\n", "      store: postgres\n      store: cassandra\n", 1)


def _null_key(text: str) -> str:
    return text.replace("config:\n", "config:\n  null: 1\n", 1)


def _integer_key(text: str) -> str:
    return text.replace("    registry:\n", "    registry:\n      1: x\n", 1)


DEEP = "  cloudstation:deep: " + "[" * 40 + "]" * 40 + "\n"
TOO_DEEP_FOR_YAML = "  cloudstation:deep: " + "[" * 5000 + "]" * 5000 + "\n"

# (id, stack, the file's content from the repository's, [what the message names, given the content])
CASES: list[tuple[str, str, Callable[[str], Union[str, bytes]], Callable[[str], list[str]]]] = [
    ("syntax-error", "test",
     lambda t: t.replace("  cloudstation:environment: test", "  cloudstation:environment: test: yes"),
     lambda t: [f"line {line_of(t, 'cloudstation:environment: test: yes')}, column", "not valid YAML",
                "mapping values are not allowed", "fix the YAML syntax"]),
    ("unclosed-bracket", "test",
     lambda t: t.replace("  cloudstation:environment: test", "  cloudstation:environment: [test"),
     lambda t: [f"while parsing a flow sequence that starts at line {line_of(t, 'cloudstation:environment: [test')}, "
                "column", "not valid YAML", "fix the YAML syntax"]),
    ("duplicate-section", "test", _dedupe_projects,
     lambda t: [f"line {line_of(t, 'cloudstation:projects:', 2)}: key 'cloudstation:projects' appears again",
                f"first at line {line_of(t, 'cloudstation:projects:')}", "keep one"]),
    ("duplicate-nested-key", "test", _nested_duplicate,
     lambda t: [f"line {line_of(t, 'store: cassandra')}: key 'store' appears again", "keep one"]),
    ("top-level-list", "test", lambda t: "- config: {}\n",
     lambda t: ["line 1: the file is a YAML list", "a mapping with a `config:` key"]),
    ("config-scalar", "test", lambda t: "config: cloudstation\n",
     lambda t: ["line 1: `config:` must be a mapping", "found a scalar"]),
    ("null-key", "test", _null_key,
     lambda t: [f"line {line_of(t, 'null: 1')}: key 'null' is not a name", "quote it, or remove the entry"]),
    ("integer-key", "test", _integer_key,
     lambda t: [f"line {line_of(t, '1: x')}: key '1' is not a name (YAML reads it as int)", "quote it"]),
    ("deep-nesting", "test", lambda t: t.replace("config:\n", "config:\n" + DEEP, 1),
     lambda t: [f"line {line_of(t, 'cloudstation:deep')}: nested deeper than {stack_yaml.MAX_DEPTH} levels"]),
    ("nesting-beyond-the-parser", "test", lambda t: t.replace("config:\n", "config:\n" + TOO_DEEP_FOR_YAML, 1),
     lambda t: [f"line {line_of(t, 'cloudstation:deep')}, column", "not valid YAML", "maximum nesting depth"]),
    ("not-utf-8", "test", lambda t: t.replace("config:\n", "# caf\udce9\nconfig:\n", 1).encode("utf-8", "surrogateescape"),
     lambda t: [f"line {line_of(t, 'caf')}: byte 0xe9 is not UTF-8", "save the file as UTF-8"]),
    ("key-without-namespace", "test", lambda t: t.replace("  cloudstation:environment: test", "  environment: test"),
     lambda t: [f"line {line_of(t, '  environment: test')}: config key 'environment' is not `<namespace>:<name>`",
                "did you mean 'cloudstation:environment'?"]),
    ("recursive-alias", "test", lambda t: t.replace("config:\n", "config:\n  cloudstation:loop: &loop [*loop]\n", 1),
     lambda t: [f"line {line_of(t, '&loop')}: a YAML alias refers to a node that contains it"]),
    ("unknown-tag", "test", lambda t: t.replace("config:\n", "config:\n  cloudstation:ref: !Ref bucket\n", 1),
     lambda t: [f"line {line_of(t, '!Ref')}, column", "'!Ref'", "plain YAML values only"]),
    ("same-key-in-old-spelling", "test",
     lambda t: t.replace("  cloudstation:environment: test", "  cloudstation:environment: test\n  cloudstation:config:environment: test"),
     lambda t: [f"line {line_of(t, 'cloudstation:config:environment')}: config key 'cloudstation:config:environment' "
                "is 'cloudstation:environment' again", "keep one"]),
]


@pytest.mark.parametrize("stack, make, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_malformed_stack_file_is_refused_with_its_line_and_fix(tmp_path, stack, make, expected):
    content = make(TEST_TEXT if stack == "test" else PROD_TEXT)
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
    message = refusal(tmp_path, stack, content)
    for piece in expected(text):
        assert piece in message, message


# --- the same, as a user runs it -----------------------------------------------------------------


@pytest.fixture(scope="module")
def program_copy(tmp_path_factory) -> Path:
    """The program in a directory of its own (stack files there are the cases')."""
    copy = tmp_path_factory.mktemp("repo")
    ignore = shutil.ignore_patterns("__pycache__", "node_modules")
    for part in ("infra", "cloudstation_tools", "components", "entities", "tests/stacks/entities"):
        shutil.copytree(ROOT / part, copy / part, ignore=ignore)
    shutil.copy(ROOT / "Pulumi.yaml", copy / "Pulumi.yaml")
    shutil.copy(stacks.DIR / "Pulumi.test.yaml", copy / "Pulumi.test.yaml")  # the fixture's, not the user's
    return copy


def render_command(directory: Path, stack: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra", "render", "--stack", stack, "--out", str(out)],
                          cwd=directory, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", ["syntax-error", "duplicate-section", "not-utf-8", "top-level-list"])
def test_render_command_exits_2_naming_file_and_line(program_copy, tmp_path, case):
    _, _, make, expected = next(c for c in CASES if c[0] == case)
    content = make(TEST_TEXT)
    stack = f"case-{case}"
    path = program_copy / f"Pulumi.{stack}.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    try:
        done = render_command(program_copy, stack, tmp_path / "out")
    finally:
        path.unlink()  # the test stack's owner check reads every stack file beside it
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.startswith(f"error: Pulumi.{stack}.yaml has 1 problem:"), done.stderr
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
    for piece in expected(text):
        assert piece in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_malformed_stack_file_beside_the_owner_is_named_not_a_traceback(program_copy, tmp_path):
    """The owner (test) reads every stack file beside it that may share its cluster."""
    (program_copy / "Pulumi.staging.yaml").write_text("config:\n  cloudstation:platform: [\n")
    try:
        done = render_command(program_copy, "test", tmp_path / "out")
    finally:
        (program_copy / "Pulumi.staging.yaml").unlink()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "Pulumi.staging.yaml has 1 problem" in done.stderr and "line 3, column 1: not valid YAML" in done.stderr


# --- config-level problems: all at once, with the command that fixes them -------------------------


def _registry_switched_to_external(text: str) -> str:
    return text.replace("      mode: shared\n", "      mode: external\n", 1)


def test_switching_the_registry_to_external_names_every_problem_at_once(tmp_path):
    message = refusal(tmp_path, "prod", _registry_switched_to_external(stacks.text()))
    lines = [line.strip() for line in message.splitlines()[1:]]
    registry = "cloudstation:platform.registry"
    expected = [f"{registry}.nodePort: 32000 — only for mode: managed or shared",
                f"{registry}.ownerNamespace: 'cloudstation' — only for mode: shared",
                f"{registry}.url: (not set) — mode: external needs the registry's url",
                f"{registry}.username: (not set) — mode: external needs the registry's username",
                f"{registry} (registryPassword): (not set) — mode: external needs the password as a secret: "
                "pulumi config set --secret cloudstation:registryPassword"]
    assert len(lines) == len(expected), message
    for line, start in zip(sorted(lines), sorted(expected)):
        assert line.startswith(start), message


def test_switching_a_store_to_external_names_every_problem_at_once(tmp_path):
    text = stacks.text().replace("        mode: managed\n        storage: {size: 1Gi}\n",
                                   "        mode: external\n        storage: {size: 1Gi}\n", 1)
    assert text != stacks.text()
    message = refusal(tmp_path, "prod", text)
    postgres = "cloudstation:platform.stores.postgres"
    for piece in (f"{postgres}.storage: {{\"size\": \"1Gi\"", "only allowed when mode is 'managed'",
                  f"{postgres}.host: (not set) — required when mode is 'external'",
                  f"{postgres}.credentialsSecret: (not set) — required when mode is 'external'"):
        assert piece in message, message
    assert message.startswith("Pulumi.prod.yaml has 3 problems"), message


@pytest.mark.parametrize("key", sorted(stack_config.SECRET_KEYS))
def test_a_plain_text_secret_is_refused_with_the_command_to_encrypt_it(tmp_path, key):
    text = TEST_TEXT.replace("config:\n", f"config:\n  cloudstation:{key}: hunter2\n", 1)
    message = refusal(tmp_path, "test", text)
    assert f"cloudstation:{key}: set in plain text" in message
    assert f"`pulumi config set --secret cloudstation:{key}`" in message
    assert "hunter2" not in message  # never echo a secret
    with pytest.raises(ConfigError, match="set in plain text"):  # promote's check of the file it writes, too
        stack_file_edits.validate(text, ROOT, "Pulumi.test.yaml", stack_dir=stacks.DIR)
    # As a `secure:` value it is fine (the key's own checks aside).
    secure = TEST_TEXT.replace("config:\n", f"config:\n  cloudstation:{key}:\n    secure: v1:abc\n", 1)
    (tmp_path / "Pulumi.test.yaml").write_text(secure)
    stack_file = render.StackFile.read("test", tmp_path)
    assert f"cloudstation:{key}" in stack_file.secret_keys


def test_kubernetes_provider_keys_are_refused_naming_the_key_to_use(tmp_path):
    extra = "  kubernetes:context: kind-prod\n  kubernetes:kubeconfig: /tmp/kubeconfig\n  kubernetes:namespace: apps\n"
    message = refusal(tmp_path, "test", TEST_TEXT.replace("config:\n", "config:\n" + extra, 1))
    lines = {line.strip().split(":", 2)[1]: line for line in message.splitlines()[1:]}
    assert "set cloudstation:kubernetes.context instead" in lines["context"]
    assert "KUBECONFIG environment variable" in lines["kubeconfig"]
    assert "every object names its own namespace" in lines["namespace"]
    assert all("`pulumi config rm kubernetes:" in line for line in lines.values())


def _registry_resources(text: str, resources: str) -> str:
    return text.replace("      storage: {size: 20Gi}\n", f"      storage: {{size: 20Gi}}\n      resources: {resources}\n", 1)


def test_numbers_are_accepted_where_a_quantity_is_meant(tmp_path):
    """`pulumi config set --path ...cpuLimit 2` stores the integer 2; YAML reads 0.5 as a float."""
    (tmp_path / "Pulumi.test.yaml").write_text(
        _registry_resources(TEST_TEXT, "{cpuLimit: 2, cpuRequest: 0.5, memoryLimit: 1073741824, memoryRequest: 64Mi}"))
    stack_file = render.StackFile.read("test", tmp_path)
    config = stacks.load(stack_file.values, secret_keys=stack_file.secret_keys)
    assert config.platform.registry.resources.spec() == {
        "requests": {"cpu": "500m", "memory": "64Mi"}, "limits": {"cpu": "2", "memory": "1073741824"}}


@pytest.mark.parametrize("resources, expected", [
    ("{memoryLimit: 2}", "cloudstation:platform.registry.resources.memoryLimit: 2 — is 2 bytes, less than 1Mi"),
    ("{memoryLimit: 512m}", "memoryLimit: '512m' — must be a memory quantity in bytes with a unit"),
    ("{cpuLimit: lots}", "cpuLimit: 'lots' — must be a CPU quantity"),
    ("{cpuLimit: true}", "cpuLimit: true — must be text, not a number or true/false"),
])
def test_a_bad_quantity_names_the_key_and_the_form(tmp_path, resources, expected):
    message = refusal(tmp_path, "test", _registry_resources(TEST_TEXT, resources))
    assert expected in message, message


def test_a_number_for_a_size_or_a_text_key_says_what_is_meant(tmp_path):
    text = TEST_TEXT.replace("      storage: {size: 20Gi}\n", "      storage: {size: 20}\n      username: 1234\n", 1)
    message = refusal(tmp_path, "test", text)
    assert "registry.storage.size: 20 — must be a size with a binary unit" in message
    assert "registry.username: 1234 — must be text" in message and "--type string" in message


# --- prod before its first promotion (item 7) ------------------------------------------------------


@pytest.mark.parametrize("folder", [pytest.param(stacks.DIR, id="fixture"),
                                    pytest.param(ROOT, id="example", marks=pytest.mark.example_stacks)])
def test_the_example_prod_file_carries_no_placeholder_images(folder):
    text = (folder / "Pulumi.prod.yaml").read_text(encoding="utf-8")
    document = yaml.safe_load(text)["config"]
    assert "image" not in document["cloudstation:platform"]["projectState"]
    assert not [e for p in document["cloudstation:projects"] for e in p["entities"] if "image" in e]
    assert "sha256:" not in "".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def test_never_promoted_prod_render_exits_2_with_the_promote_command(tmp_path, fixture_project):
    done = render_command(fixture_project, "prod", tmp_path / "out")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: Pulumi.prod.yaml has 1 problem:"), done.stderr
    assert "never promoted" in done.stderr and f"`{PROMOTE}`" in done.stderr
    assert not (tmp_path / "out").exists()


def test_one_promotion_makes_prod_valid_and_a_placeholder_digest_is_refused(tmp_path):
    assert stacks.validate_config("prod").environment.value == "prod"
    text = stacks.text()
    real = stacks.images()["shop/likes"].rpartition("@")[2]
    placeholder = "sha256:" + "0" * 63 + "2"
    message = refusal(tmp_path, "prod", text.replace(real, placeholder))
    assert "cloudstation:projects[0].entities[1].image:" in message
    assert "is a placeholder digest" in message and f"`{PROMOTE}`" in message


# --- under the engine: config from the environment the language host sets ------------------------


@pytest.fixture
def engine(monkeypatch):
    return engine_start(monkeypatch)


def engine_start(monkeypatch) -> Callable[[str, render.StackFile], ProgramMocks]:
    """Run the program (or read its config) with a stack file's config passed as the engine does:
    PULUMI_CONFIG, and PULUMI_CONFIG_SECRET_KEYS, which the Python language host always sets (`[]`
    when there is no secret: pulumi/pulumi sdk/python/cmd/pulumi-language-python/main.go
    `constructConfigSecretKeys`). Fresh mocks; nothing set through set_all_config. The other stack
    files the program reads are the fixtures' (tests/stacks/), as if they were beside Pulumi.yaml."""
    monkeypatch.setattr(stack_context, "STACK_DIR", stacks.DIR)

    def start(stack: str, stack_file: render.StackFile) -> ProgramMocks:
        mocks = ProgramMocks()
        pulumi.runtime.settings.ROOT.set(None)
        pulumi.runtime.set_mocks(mocks, project="cloudstation", stack=stack, preview=False,
                                 monitor=RecordingMonitor(mocks))
        pulumi.runtime.set_all_config({}, [])
        monkeypatch.setenv("PULUMI_CONFIG", json.dumps(stack_file.values))
        monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", json.dumps(stack_file.secret_keys))
        return mocks

    return start


def _refused_before_any_resource(engine, stack: str, stack_file: render.StackFile) -> str:
    mocks = engine(stack, stack_file)
    with pytest.raises(pulumi.RunError) as caught:
        program.main()
    assert mocks.registrations == []
    return str(caught.value)


def test_the_program_refuses_a_never_promoted_prod_before_any_resource(engine):
    message = _refused_before_any_resource(engine, "prod", render.StackFile.read("prod", stacks.DIR))  # never promoted
    assert "Pulumi.prod.yaml was never promoted" in message and f"`{PROMOTE}`" in message


def test_the_program_refuses_plain_secrets_and_provider_keys_from_the_engine(engine):
    stack_file = stacks.read("test")
    stack_file.values["cloudstation:armadaQueueApiPassword"] = "hunter2"  # plain: not in the secret keys
    stack_file.values["kubernetes:context"] = "kind-test"
    message = _refused_before_any_resource(engine, "test", stack_file)
    assert "cloudstation:armadaQueueApiPassword: set in plain text" in message and "hunter2" not in message
    assert "pulumi config set --secret cloudstation:armadaQueueApiPassword" in message
    assert "kubernetes:context: not read" in message and "cloudstation:kubernetes.context" in message
    # The same value as a secret (listed in PULUMI_CONFIG_SECRET_KEYS) is accepted.
    del stack_file.values["kubernetes:context"]
    stack_file.secret_keys.append("cloudstation:armadaQueueApiPassword")
    engine("test", stack_file)
    assert program.read_config().environment.value == "test"


def test_the_program_takes_numbers_for_quantities_from_the_engine(engine):
    stack_file = stacks.read("prod")
    platform = json.loads(stack_file.values["cloudstation:platform"])
    platform["stores"]["postgres"]["resources"] = {"cpuLimit": 2, "cpuRequest": 0.25}  # as `config set --path` stores them
    stack_file.values["cloudstation:platform"] = json.dumps(platform)
    engine("prod", stack_file)
    resources = program.read_config().platform.stores.postgres.resources
    assert (resources.cpu_limit, resources.cpu_request) == ("2", "250m")
