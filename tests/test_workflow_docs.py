"""docs/teardown-and-upgrades.md does what it says: its offline blocks run (in a copy of the repository)
and print what the program keeps and what an upgrade replaces; every other command names a file,
script or `python -m infra` subcommand that exists, and every kubectl call names the stack's context;
the kept objects it names are the ones the stacks keep. Plus the newcomer fixes in the other guides:
plain `pulumi` commands come after `source scripts/env.sh`, and a promotion commits its history file."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from cloudstation_tools import cli, render
from tests import stacks
from tests.conftest import ROOT
from tests.test_up_script import BASH, Sandbox

DOC = ROOT / "docs" / "teardown-and-upgrades.md"
OPERATIONS = ROOT / "docs" / "operations.md"
PROMOTION = ROOT / "docs" / "promotion.md"
OFFLINE = "<!-- offline -->"
PULUMI_COMMANDS = {"destroy", "stack", "preview", "up", "state", "login", "config", "import"}


def bash_blocks(path: Path) -> list[tuple[bool, str]]:
    """(offline, text) of every ```bash block, dedented; offline when `<!-- offline -->` precedes it."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in re.finditer(r"^([ \t]*)```bash\n(.*?)^[ \t]*```", text, flags=re.S | re.M):
        indent = len(match.group(1))
        body = "\n".join(line[indent:] if line.strip() else "" for line in match.group(2).splitlines()) + "\n"
        before = [line.strip() for line in text[: match.start()].splitlines() if line.strip()]
        blocks.append((bool(before) and before[-1] == OFFLINE, body))
    return blocks


def test_doc_has_offline_and_cluster_blocks():
    blocks = bash_blocks(DOC)
    assert DOC.read_text().count(OFFLINE) == sum(offline for offline, _ in blocks) >= 3
    for offline, body in blocks:
        if offline:  # what runs offline must not need the cluster or the Pulumi CLI
            assert not re.search(r"^\s*(kubectl|pulumi|source)\b", body, flags=re.M), body


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    """The offline blocks run in order in a copy of the repository, with an upgrade between the
    "before" and "after" renders: every managed PostgreSQL's volume grows (a StatefulSet replacement)."""
    sandbox = Sandbox(tmp_path_factory.mktemp("docs"))
    stacks.write(sandbox.repo)  # the guide is for deployed stacks: prod as its first promotion writes it
    env = {**sandbox.env, "PATH": f"{sandbox.repo / '.venv' / 'bin'}:{sandbox.env['PATH']}"}
    outputs = []
    for offline, body in bash_blocks(DOC):
        if not offline:
            continue
        if "--against rendered/before" in body:
            stack_file = sandbox.repo / "Pulumi.test.yaml"
            document = yaml.safe_load(stack_file.read_text())
            platform = document["config"].setdefault("cloudstation:platform", {})
            postgres = platform.setdefault("stores", {}).setdefault("postgres", {})
            postgres.setdefault("storage", {})["size"] = "123Gi"
            stack_file.write_text(yaml.safe_dump(document, sort_keys=False))
        done = subprocess.run([BASH, "-euo", "pipefail", "-c", body], cwd=sandbox.repo, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{body}\n{done.stderr}"
        outputs.append(done.stdout)
    return sandbox, outputs


def _kept(rendered) -> set[tuple[str, str, str]]:
    return {
        (r.inputs["kind"], (r.inputs.get("metadata") or {}).get("namespace", "-"), r.inputs["metadata"]["name"])
        for r in rendered.registrations if (r.options or {}).get("retainOnDelete")
    }


def test_the_kept_list_is_what_the_stacks_keep(offline_run, rendered_stacks):
    lines = [line.split() for line in offline_run[1][0].splitlines() if line.strip()]
    for stack, rendered in rendered_stacks.items():
        listed = {tuple(line[1:]) for line in lines if line[0] == stack}
        assert listed == _kept(rendered), stack
        assert listed


def _claim_templates(directory: Path) -> dict[str, list]:
    resources = json.loads((directory / "resources.json").read_text())
    return {r["urn"]: r["inputs"]["spec"]["volumeClaimTemplates"] for r in resources
            if r["type"] == "kubernetes:apps/v1:StatefulSet"}


def test_the_upgrade_check_shows_the_replacement(offline_run):
    sandbox, outputs = offline_run
    report = outputs[-1]
    checked, report = report.split("== test", 1)
    assert "cloudstation check: 2 stack file(s)" in checked and " 0 errors" in checked, checked  # check runs first
    test_part, prod_part = report.split("== prod")
    before = _claim_templates(sandbox.repo / "rendered" / "before" / "test")
    after = {r.urn: r.inputs["spec"]["volumeClaimTemplates"] for r in render.render("test", sandbox.repo).registrations
             if r.type == "kubernetes:apps/v1:StatefulSet"}  # the stack file as upgraded
    grown = [urn for urn in after if urn in before and after[urn] != before[urn]]
    assert grown, "the simulated upgrade changed no StatefulSet's volume"
    replaced = re.findall(r"^replace StatefulSet \S+ \((\S+)\)$", test_part, flags=re.M)
    assert sorted(replaced) == sorted(urn.rsplit("::", 1)[1] for urn in grown), report
    assert "PROBLEM" not in report
    assert not re.search(r"^(replace|update|delete|create)", prod_part, flags=re.M), report


def test_kept_kinds_are_named_in_the_doc(rendered_stacks):
    section = DOC.read_text(encoding="utf-8").split("### What a teardown keeps", 1)[1].split("\n### ", 1)[0]
    kinds = {kind for rendered in rendered_stacks.values() for kind, _, _ in _kept(rendered)}
    assert kinds
    for kind in kinds:
        assert kind in section, f"the kept {kind} objects are not explained"


def test_deleting_kept_objects_deletes_exactly_them(offline_run, rendered_stacks):
    """The teardown's deletion block, run with a fake kubectl after the kept list was written: each
    stack's kept namespaces, prod's first, then the kept CRDs, all on the stack's context."""
    sandbox, _ = offline_run
    body = next(body for offline, body in bash_blocks(DOC) if "delete crd" in body)
    sandbox.tools("kubectl")
    sandbox.log.write_text("")
    done = subprocess.run([BASH, "-euo", "pipefail", "-c", body], cwd=sandbox.repo, env=sandbox.env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    calls = sandbox.calls("kubectl")
    assert all(argv[:2] == ["--context", "kind-current"] for argv in calls if argv[:2] != ["config", "current-context"])
    deletes = [argv[argv.index("delete") + 1:] for argv in calls if "delete" in argv]
    expected = [["namespace", *sorted(name for kind, _, name in _kept(rendered_stacks[stack]) if kind == "Namespace")]
                for stack in ("prod", "test")]
    crds = {name for stack in rendered_stacks.values() for kind, _, name in _kept(stack) if kind == "CustomResourceDefinition"}
    assert [[d[0], *sorted(d[1:])] for d in deletes[:2]] == expected
    assert deletes[2][0] == "crd" and set(deletes[2][1:]) == crds and len(deletes) == 3


def _commands(body: str) -> list[str]:
    """Logical lines of a shell block (continuations joined), without comments and heredoc bodies."""
    lines, heredoc = [], None
    for line in body.splitlines():
        if heredoc:
            if line.strip() == heredoc:
                heredoc = None
            continue
        marker = re.search(r"<<'?(\w+)'?", line)
        if marker:
            heredoc = marker.group(1)
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


@pytest.mark.parametrize("path", [DOC, OPERATIONS], ids=lambda p: p.name)
def test_infra_commands_scripts_and_files_exist(path):
    text = path.read_text(encoding="utf-8")
    for _, body in bash_blocks(path):
        for line in _commands(body):
            for command in re.findall(r"python -m infra ([^)|&;<>]*)", line):
                argv = shlex.split(command)
                try:
                    cli.parser().parse_args(argv)
                except SystemExit:
                    pytest.fail(f"{path.name}: `python -m infra {command}` is not a valid command")
            for script in re.findall(r"(?:bash|source) (scripts/[\w.-]+)", line):
                assert (ROOT / script).is_file(), script
    for reference in re.findall(r"`((?:infra|components|policy|scripts|docs|tests)/[\w./-]+\.(?:py|sh|md|json|yaml))`", text):
        assert (ROOT / reference).is_file(), f"{path.name} names {reference}, which does not exist"


def test_pulumi_and_kubectl_commands_in_the_doc():
    lines = [line for offline, body in bash_blocks(DOC) if not offline for line in _commands(body)]
    pulumi = [line for line in lines if re.match(r"(\w+=\S+ )*pulumi ", line)]
    kubectl = [line for line in lines if "kubectl " in line]
    assert pulumi and kubectl
    for line in pulumi:
        assert line.split("pulumi ", 1)[1].split()[0] in PULUMI_COMMANDS, line
        if " stack rm " in f" {line} ":
            assert "--preserve-config" in line, f"{line}: would delete the stack file"
        assert "--remove" not in line.split(), line
    for line in kubectl:
        assert 'kubectl --context "$ctx" ' in line, f"{line}: every kubectl call names the stack's context"


@pytest.mark.parametrize("path", [DOC, OPERATIONS], ids=lambda p: p.name)
def test_plain_pulumi_commands_come_after_env_sh(path):
    """`pulumi ...` run by hand finds the backend only after `source scripts/env.sh` (scripts/up.sh
    sets it only for itself); the first block with such a command, or the text before it, says so."""
    text = path.read_text(encoding="utf-8")
    section_end = text.find("\n## CI")
    text = text if section_end < 0 else text[:section_end]  # the CI section uses CI's own backend
    first = re.search(r"^(?:[ \t]*)(?:export \w+=\"\$\()?pulumi (?:stack|preview|destroy|state)\b", text, flags=re.M)
    assert first, path.name
    assert "source scripts/env.sh" in text[: first.start()], f"{path.name}: plain pulumi before `source scripts/env.sh`"


def test_promotion_commit_includes_the_history_file():
    for path in (PROMOTION, OPERATIONS):
        for _, body in bash_blocks(path):
            for line in _commands(body):
                if "git commit" in line:
                    assert "-am" not in line.split(), f"{path.name}: `git commit -am` misses the new promotions.prod.jsonl"
                    if "promote" in line:
                        assert "promotions.prod.jsonl" in line, line


def test_operations_links_the_teardown_doc():
    assert "(teardown-and-upgrades.md)" in OPERATIONS.read_text(encoding="utf-8")
