"""`cloudstation diff --stack S [--against REF]` (cloudstation_tools/diff.py, issue 21 item 3): what `pulumi up`
of the working tree would create, update, replace, delete or leave behind, and why, offline, against a render
directory, a git ref, or by default the last deployment from this checkout (else HEAD)."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from cloudstation_tools import baseline, cli, render
from tests.test_check import edit, project  # noqa: F401  (a fixture)
from tests.test_up_script import BASH, Sandbox


def run_diff(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["diff", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_volume_change_replaces_the_statefulset_and_says_why(project, tmp_path, capsys):  # noqa: F811
    before = tmp_path / "before"
    render.write(render.render("test", project), before)
    edit(project, "test", lambda c: c["cloudstation:platform"]["stores"]["postgres"].__setitem__("storage", {"size": "5Gi"}))
    code, out, _ = run_diff(capsys, "--stack", "test", "--against", str(before), "--root", str(project))
    assert code == 0, out
    assert out.startswith(f"== test: against the render in {before}\n")
    replaced = [line for line in out.splitlines() if line.startswith("replace ")]
    assert "replace StatefulSet shop-test/shop-postgres (shop-postgres-statefulset)" in replaced
    assert "replace StatefulSet cloudstation-state/project-state-postgres (project-state-postgres-statefulset)" in replaced
    block = out.split("replace StatefulSet shop-test/shop-postgres (shop-postgres-statefulset)\n", 1)[1].split("\n")
    assert block[0].startswith("    spec.volumeClaimTemplates[0].spec.resources.requests.storage: the provider replaces")
    assert any(line.startswith("    order: ") for line in block[:4])
    assert out.rstrip().splitlines()[-1].startswith("test: 2 to replace, ")
    assert "PROBLEM" not in out


def test_removing_an_entity_deletes_its_objects(project, tmp_path, capsys):  # noqa: F811
    before = tmp_path / "before"
    render.write(render.render("test", project), before)
    edit(project, "test", lambda c: c["cloudstation:projects"][0]["entities"].pop(1))  # likes
    code, out, _ = run_diff(capsys, "--stack", "test", "--against", str(before), "--root", str(project), "--format", "json")
    assert code == 0
    report = json.loads(out)
    deleted = {step["label"] for step in report["steps"] if step["action"] == "delete"}
    assert "StatefulService shop-test/shop-likes (shop-shop-likes)" in deleted, deleted
    assert not [step for step in report["steps"] if step["action"] == "create"]


def test_nothing_to_compare_with_is_exit_2(project, capsys):  # noqa: F811
    code, _, err = run_diff(capsys, "--stack", "test", "--root", str(project))
    assert code == 2 and "nothing to compare with" in err and "--against" in err
    code, _, err = run_diff(capsys, "--stack", "test", "--root", str(project), "--against", "main")
    assert code == 2 and "not a git work tree" in err


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_against_a_git_ref_and_by_default_head(tmp_path):
    """In a repository copy under git: the default baseline is HEAD (rendered from HEAD's own program and
    stack files), and the last deployment from this checkout wins once scripts/up.sh wrote it."""
    sandbox = Sandbox(tmp_path)
    repo = sandbox.repo
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    text = (repo / "Pulumi.test.yaml").read_text()
    (repo / "Pulumi.test.yaml").write_text(text.replace("storage: {size: 1Gi}", "storage: {size: 3Gi}", 1))
    env = {**sandbox.env, "PATH": f"{sandbox.env['PATH']}:/usr/bin:/bin"}
    done = subprocess.run([BASH, "-c", ".venv/bin/python -m infra diff --stack test"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("== test: against git HEAD (")
    assert "replace StatefulSet shop-test/shop-postgres (shop-postgres-statefulset)" in done.stdout
    # A deployment recorded since: the comparison is with it (here: the edited file, so nothing changes).
    deployed = repo / baseline.DEPLOYED / "test"
    subprocess.run([BASH, "-c", f".venv/bin/python -m infra render --stack test --out {deployed}"], cwd=repo, env=env,
                   check=True, capture_output=True, timeout=600)
    done = subprocess.run([BASH, "-c", ".venv/bin/python -m infra diff --stack test"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "against the last deployment from this checkout (.cloudstation/deployed/test)" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == "test: 0 to replace, 0 to update, 0 to create, 0 to delete, 0 kept"
