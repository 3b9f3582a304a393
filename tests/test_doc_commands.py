"""Docs drift: every command README.md and docs/*.md show in shell code blocks (`python -m infra ...`,
`bash scripts/...`, `source scripts/...`, `.venv/bin/python ...`) is run here, exactly as written,
where it can run offline, or is listed below with the reason it cannot run on this machine (a
cluster, the Pulumi CLI). A command added to the docs fails test_every_doc_command_is_classified
until it is classified; a classified command gone from the docs fails it too.

The runnable ones run in one copy of the repository (tests/test_up_script.py's Sandbox: its own
PATH, fake kubectl), in the docs' order: render test, promote (dry run, all, one project, named
entities) against a throwaway local registry and a file:// state backend (cloudstation_tools/try_promotion.py's
playground), render prod once it is promoted, roll back (dry run, latest, to promotion 1), preflight
and port-forwards with the fake kubectl, `source scripts/env.sh`, and `python -m infra try-promotion`.
The teardown guide's offline blocks run in tests/test_workflow_docs.py (checked here).

Also: the command line's own refusals (cloudstation_tools/cli.py) name a remedy that works, and the config
reference describes every key."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from cloudstation_tools import config_reference, promote, stack_file, try_promotion
from tests.conftest import ROOT
from tests.test_up_script import BASH, Sandbox
from tests.test_workflow_docs import bash_blocks

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TEARDOWN = ROOT / "docs" / "teardown-and-upgrades.md"
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
SHELL = {"bash", "sh", "shell", "console", "zsh", ""}
MARKER = re.compile(
    r"(?:\b[A-Z_][A-Z0-9_]*=(?:\"[^\"]*\"|'[^']*'|\S+)\s+)*"  # VAR=value prefixes belong to the command
    r"(?:(?:\.venv/bin/)?python3? -m infra\b|\.venv/bin/python\b|\bbash scripts/|\bsource scripts/)"
)
"""Where a command of this project starts in a shell line."""

UP = ("`pulumi up` against the stack's cluster: needs a cluster and the Pulumi CLI "
      "(tests/test_up_script.py walks scripts/up.sh with fake pulumi, kubectl and docker)")
OFFLINE_BLOCK = "offline block"
"""Runs in tests/test_workflow_docs.py's `offline_run` (an `<!-- offline -->` block of TEARDOWN)."""

RUN = "run here"
CLASSIFIED = {
    # --- run here, in this order (the session below) ---
    ".venv/bin/python -m infra check": RUN,
    ".venv/bin/python -m infra check --stack prod --format json": RUN,
    ".venv/bin/python -m infra render --stack test --out rendered/test": RUN,
    "source scripts/env.sh": RUN,
    "python -m infra promote --from test --to prod --dry-run": RUN,
    "python -m infra promote --from test --to prod": RUN,
    ".venv/bin/python -m infra render --stack prod --out rendered/prod --promoted-from test": RUN,
    "python -m infra promote --from test --to prod --project shop": RUN,
    "python -m infra promote --from test --to prod --entity shop/cart --entity platform/project-state": RUN,
    "python -m infra rollback --stack prod --dry-run": RUN,
    "python -m infra rollback --stack prod": RUN,
    "python -m infra rollback --stack prod --to 1": RUN,
    ".venv/bin/python -m infra preflight --stack prod --context-only": RUN,
    ".venv/bin/python -m infra preflight --stack test --context-only": RUN,
    ".venv/bin/python -m infra port-forwards --stack test": RUN,
    "python -m infra try-promotion": RUN,
    # --- the teardown guide's offline blocks (tests/test_workflow_docs.py runs them) ---
    '.venv/bin/python -m infra render --stack "$stack" --out "rendered/$stack"': OFFLINE_BLOCK,
    '.venv/bin/python - "rendered/$stack/resources.json"': OFFLINE_BLOCK,
    ".venv/bin/python -m infra render --stack test --out rendered/before/test": OFFLINE_BLOCK,
    ".venv/bin/python -m infra render --stack prod --out rendered/before/prod": OFFLINE_BLOCK,
    ".venv/bin/python -m infra check --against rendered/before": OFFLINE_BLOCK,
    ".venv/bin/python -m infra diff --stack test --against rendered/before": OFFLINE_BLOCK,
    ".venv/bin/python -m infra diff --stack prod --against rendered/before": OFFLINE_BLOCK,
    # --- cannot run here ---
    ".venv/bin/python -m infra diff --stack test": "compares with the last deployment from this checkout "
                                                   "(.cloudstation/deployed/test) or git HEAD, which the session's "
                                                   "copy has neither of; tests/test_diff_command.py runs it in a git copy",
    "bash scripts/up.sh test": UP,
    "bash scripts/up.sh prod": UP,
    "bash scripts/up.sh test --replace 'urn:pulumi:test::cloudstation::cloudstation:delivery:Registry$pulumi-python:"
    "dynamic/secrets:KeptSecret::registry-auth-values'": UP,
    'bash scripts/up.sh test --replace "$urn"': UP,
    "bash scripts/up.sh test --policy-pack policy --policy-pack-config policy/config.json": UP,
    "bash scripts/up.sh prod --policy-pack policy --policy-pack-config policy/config.json": UP,
    "python -m infra pin-images --missing": "asks Docker Hub and the other image registries for the new pins' "
                                            "digests (network access and skopeo); tests/test_images.py runs pin-images "
                                            "against a local registry (Debian's docker-registry)",
    "bash scripts/e2e.sh": "the end-to-end tier (README, \"End-to-end tests\"): builds the real control plane, "
                           "Pulumi CLI and provider from Go modules and deploys for real; .ci/run runs it after "
                           "this suite",
    "bash scripts/e2e.sh -k test_1 --keep": "one step of the end-to-end tier (see `bash scripts/e2e.sh`)",
    "bash scripts/test.sh": "runs this whole suite, so it would run itself; CI runs exactly it (tests/test_docs.py "
                            "checks the workflow)",
    'CLOUDSTATION_REGISTRY_ADDRESSES="localhost:32000=127.0.0.1:5000" python -m infra promote --from test --to prod':
        "needs the cluster registry's port-forward at 127.0.0.1:5000; the same promotion runs here against a local "
        "registry mapped the same way (CLOUDSTATION_REGISTRY_ADDRESSES)",
}
"""Every documented command: RUN (by `session` below), OFFLINE_BLOCK, or why it cannot run here."""


# --- finding the commands ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    command: str
    where: str


def code_blocks(text: str) -> Iterator[tuple[str, int, list[tuple[int, str]]]]:
    """(language, first line, [(line number, line)]) of every fenced block, fences paired in order."""
    inside = None
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if inside is None:
            if fence:
                inside = (fence.group(3), number, [])
        elif fence and not fence.group(3):
            yield inside
            inside = None
        else:
            inside[2].append((number, line))


def logical_lines(body: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Shell lines with continuations joined, prompts (`$ `) dropped and heredoc bodies skipped."""
    heredoc, pending, start = None, "", None
    for number, line in body:
        if heredoc:
            if line.strip() == heredoc:
                heredoc = None
            continue
        start = start or number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text, pending = re.sub(r"^\s*\$ ", "", pending + line), ""
        marker = re.search(r"<<-?\s*'?(\w+)'?", text)
        if marker:
            heredoc = marker.group(1)
        yield start, text
        start = None


def commands_in(line: str) -> Iterator[str]:
    """This project's commands in one shell line: split at `$(`, `<(`, `)`, `&&`, `||`, `|` and `;`,
    without comments, trailing redirections and `&`."""
    line = re.sub(r"(^|\s)#.*$", "", line)
    for part in re.split(r"\$\(|<\(|\)|&&|\|\||\||;", line):
        start = MARKER.search(part)
        if not start:
            continue
        command = part[start.start():]
        while (shorter := re.sub(r"\s*(?:\d?>>?\s*\S+|<<-?\s*'?\w+'?|<\s*\S*|&)\s*$", "", command)) != command:
            command = shorter
        yield " ".join(command.split())


def doc_commands(paths=DOCS) -> list[Found]:
    found = []
    for path in paths:
        for language, _, body in code_blocks(path.read_text(encoding="utf-8")):
            if language not in SHELL:
                continue
            for number, line in logical_lines(body):
                found += [Found(command, f"{path.name}:{number}") for command in commands_in(line)]
    return found


def test_the_command_finder_sees_every_form(tmp_path):
    text = (
        "```bash\nctx=\"$(.venv/bin/python -m infra preflight --stack prod --context-only)\"\n"
        "done < <(.venv/bin/python -m infra port-forwards --stack test)\n"
        "git diff && bash scripts/up.sh prod   # deploy\n"
        "A=1 B='x y' python -m infra render \\\n  --stack test --out r >/dev/null\n"
        ".venv/bin/python - a <<'EOF'\npython -m infra not-a-command-inside-a-heredoc\nEOF\n```\n"
        "```\n$ source scripts/env.sh\n```\n```yaml\nx: python -m infra render\n```\n"
    )
    path = tmp_path / "sample.md"
    path.write_text(text, encoding="utf-8")
    assert [f.command for f in doc_commands([path])] == [
        ".venv/bin/python -m infra preflight --stack prod --context-only",
        ".venv/bin/python -m infra port-forwards --stack test",
        "bash scripts/up.sh prod",
        "A=1 B='x y' python -m infra render --stack test --out r",
        ".venv/bin/python - a",
        "source scripts/env.sh",
    ]


def test_every_doc_command_is_classified():
    found = doc_commands()
    commands = {f.command for f in found}
    unclassified = sorted({f"{f.where}: {f.command}" for f in found if f.command not in CLASSIFIED})
    assert not unclassified, (
        "documented commands that no test runs and none is excused from: run them in this file's session or "
        "list them in CLASSIFIED with the reason they cannot run here:\n" + "\n".join(unclassified)
    )
    gone = sorted(set(CLASSIFIED) - commands)
    assert not gone, f"classified commands no longer in the docs (remove them from CLASSIFIED): {gone}"


def test_offline_block_commands_are_in_the_blocks_the_workflow_docs_test_runs():
    offline = "\n".join(body for is_offline, body in bash_blocks(TEARDOWN) if is_offline)
    in_offline = {command for _, line in logical_lines(list(enumerate(offline.splitlines(), 1)))
                  for command in commands_in(line)}
    for found in doc_commands():
        if CLASSIFIED.get(found.command) == OFFLINE_BLOCK:
            assert found.where.startswith(TEARDOWN.name + ":") and found.command in in_offline, found
    import tests.test_workflow_docs as workflow_docs

    assert callable(getattr(workflow_docs, "offline_run", None))  # the fixture that runs them


def test_excused_commands_say_why():
    for command, why in CLASSIFIED.items():
        assert why in (RUN, OFFLINE_BLOCK) or len(why) > 40, command
    assert (ROOT / "tests" / "test_up_script.py").is_file()


# --- the runnable commands, run as written -----------------------------------------------------------


class Session:
    """The repository copy the documented commands run in, and what they printed."""

    def __init__(self, sandbox: Sandbox, place: try_promotion.Playground):
        self.sandbox, self.place = sandbox, place
        self.ran: dict[str, subprocess.CompletedProcess] = {}
        python = sandbox.bin / "python"
        if not python.exists():
            python.symlink_to(sandbox.repo / ".venv" / "bin" / "python")  # `python` is the venv's
        sandbox.tools("kubectl")
        self.env = {**sandbox.env, **{k: v for k, v in place.environment.items() if k != "PATH"}}

    def run(self, command: str, **env: str) -> subprocess.CompletedProcess:
        assert CLASSIFIED.get(command) == RUN, f"{command!r} is not a documented command to run here"
        done = subprocess.run([BASH, "-euo", "pipefail", "-c", command], cwd=self.sandbox.repo,
                              env={**self.env, **env}, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"`{command}` failed:\n{done.stdout}\n{done.stderr}"
        self.ran[command] = done
        return done

    def images(self) -> dict[str, str]:
        text = stack_file.read_text(self.sandbox.repo / "Pulumi.prod.yaml")
        return {key: slot.value for key, slot in stack_file.image_slots(text).items()}


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Iterator[Session]:
    sandbox = Sandbox(tmp_path_factory.mktemp("doc-commands"))
    with try_promotion.playground(sandbox.repo) as place:
        yield Session(sandbox, place)


def test_documented_commands_run(session):
    """The runnable commands, in the docs' order, each exactly as written; every RUN entry runs."""
    repo, place = session.sandbox.repo, session.place
    keys = list(place.images)
    v1 = place.deploy_test({key: "v1" for key in keys})

    # The first thing after an edit: every stack file clean; prod's first promotion is a notice (exit 0).
    done = session.run(".venv/bin/python -m infra check")
    assert "0 errors" in done.stdout and "was never promoted" in done.stdout
    done = session.run(".venv/bin/python -m infra check --stack prod --format json")
    assert json.loads(done.stdout)["exitCode"] == 0
    session.run(".venv/bin/python -m infra render --stack test --out rendered/test")
    assert (repo / "rendered" / "test" / "manifests.yaml").is_file()
    # Never promoted yet: reviewed as its first promotion would write it, the file untouched.
    unpromoted = (repo / "Pulumi.prod.yaml").read_bytes()
    session.run(".venv/bin/python -m infra render --stack prod --out rendered/prod --promoted-from test")
    assert (repo / "rendered" / "prod" / "manifests.yaml").is_file()
    assert (repo / "Pulumi.prod.yaml").read_bytes() == unpromoted

    done = session.run("source scripts/env.sh")  # no .pulumi-state/ in the copy: says so, sets nothing
    assert "scripts/env.sh: nothing to export" in done.stderr

    before = (repo / "Pulumi.prod.yaml").read_bytes()
    done = session.run("python -m infra promote --from test --to prod --dry-run")
    assert f"dry run: would promote {len(keys)} image(s)" in done.stdout
    assert (repo / "Pulumi.prod.yaml").read_bytes() == before

    done = session.run("python -m infra promote --from test --to prod")
    assert f"promoted {len(keys)} image(s) in Pulumi.prod.yaml" in done.stdout and session.images() == v1

    session.run(".venv/bin/python -m infra render --stack prod --out rendered/prod --promoted-from test")  # promoted: as it is
    assert (repo / "rendered" / "prod" / "manifests.yaml").is_file()

    v2 = place.deploy_test({key: "v2" for key in keys})  # test deploys new versions of everything
    session.run("python -m infra promote --from test --to prod --project shop")
    assert session.images() == {key: (v2 if key.startswith("shop/") else v1)[key] for key in keys}
    session.run("python -m infra promote --from test --to prod --entity shop/cart --entity platform/project-state")
    assert session.images()["platform/project-state"] == v2["platform/project-state"]

    done = session.run("python -m infra rollback --stack prod --dry-run")
    assert "dry run: would roll back 1 image(s)" in done.stdout and "(undoes promotion 3)" in done.stdout
    session.run("python -m infra rollback --stack prod")
    assert session.images()["platform/project-state"] == v1["platform/project-state"]
    done = session.run("python -m infra rollback --stack prod --to 1")
    assert "(undoes promotion 2)" in done.stdout and session.images() == v1
    history = promote.read_history(repo, "prod")
    assert [(r["action"], r.get("undoes")) for r in history] == [
        ("promote", None), ("promote", None), ("promote", None), ("rollback", [3]), ("rollback", [2])]

    for stack in ("prod", "test"):  # the fake kubectl's current context: kind-current
        done = session.run(f".venv/bin/python -m infra preflight --stack {stack} --context-only")
        assert done.stdout.strip() == "kind-current"
    done = session.run(".venv/bin/python -m infra port-forwards --stack test")
    lines = [line.split() for line in done.stdout.splitlines()]
    assert lines and all(len(line) == 3 and re.fullmatch(r"\d+:\d+", line[2]) for line in lines)

    not_run = sorted(c for c, how in CLASSIFIED.items() if how == RUN and c not in session.ran
                     and c != "python -m infra try-promotion")
    assert not not_run, f"classified as run here but not run: {not_run}"


def test_try_promotion_runs_the_whole_flow(session, tmp_path):
    # Without the registry tools it says what to install (the remedy), and runs once they are there.
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("dirname",):
        (bare / tool).symlink_to(shutil.which(tool))
    (bare / "python").symlink_to(session.sandbox.repo / ".venv" / "bin" / "python")
    refused = subprocess.run([BASH, "-c", "python -m infra try-promotion"], cwd=session.sandbox.repo,
                             env={**session.sandbox.env, "PATH": str(bare)}, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "apt-get install docker-registry skopeo" in refused.stderr, refused.stderr

    path = ":".join([str(session.sandbox.bin), "/usr/bin", "/bin"])  # docker-registry and skopeo
    files = {name: (session.sandbox.repo / name).read_bytes() for name in ("Pulumi.prod.yaml", "Pulumi.test.yaml")}
    done = session.run("python -m infra try-promotion", PATH=path)
    out = done.stdout
    for step in ("$ python -m infra promote --from test --to prod --dry-run", "$ python -m infra promote --from test "
                 "--to prod", "$ python -m infra rollback --stack prod --dry-run", "$ python -m infra rollback --stack prod"):
        assert step in out
    assert out.count("+++ b/Pulumi.prod.yaml") == 5  # dry run, promote, second promote, rollback dry run, rollback
    assert re.search(r"#3 rollback \S+ done undoes \[2\]", out) and "tags of shop/cart in the registry:" in out
    assert "(generated)" in out and try_promotion.USERNAME in out
    # The repository's stack files are untouched (it works on copies).
    assert files == {name: (session.sandbox.repo / name).read_bytes() for name in files}


# --- the command line's own refusals name a remedy that works ----------------------------------------


def test_no_kube_context_names_its_fix(session):
    """`preflight --context-only` without a context says to set one; with a current context it works."""
    command = ".venv/bin/python -m infra preflight --stack test --context-only"
    refused = subprocess.run([BASH, "-c", command], cwd=session.sandbox.repo,
                             env={**session.env, "FAKE_CURRENT_CONTEXT": ""}, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "set cloudstation:kubernetes.context or a current context" in refused.stderr
    assert session.run(command, FAKE_CURRENT_CONTEXT="kind-other").stdout.strip() == "kind-other"


def test_a_stale_config_reference_names_its_fix(tmp_path, capsys):
    from cloudstation_tools import cli

    out = tmp_path / "reference.md"
    out.write_text("old", encoding="utf-8")
    assert cli.main(["config-reference", "--check", "--out", str(out)]) == 1
    remedy = re.search(r"`python -m infra (config-reference)`", capsys.readouterr().err)
    assert remedy
    assert cli.main([remedy.group(1), "--out", str(out)]) == 0
    assert cli.main(["config-reference", "--check", "--out", str(out)]) == 0


# --- the config reference describes every key --------------------------------------------------------


def test_every_config_key_is_described():
    empty = [row.key for row in config_reference.rows() if not row.description.strip()]
    assert not empty, f"config keys without a description (add an attribute docstring to the model field): {empty}"
