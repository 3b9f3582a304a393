"""`render --promoted-from test`: prod before its first promotion is reviewed as the first
promotion would write it (the CI workflow renders it so), and a promoted prod renders as it is."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from cloudstation_tools import cli, render
from tests import stacks


def _run(project: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra", *argv], cwd=project, capture_output=True, text=True,
                          timeout=300)


def test_never_promoted_prod_renders_as_its_first_promotion_would_write_it(tmp_path, fixture_project):
    plain = _run(fixture_project, "render", "--stack", "prod", "--out", str(tmp_path / "plain"))
    assert plain.returncode == 2 and "promote --from test --to prod" in plain.stderr + plain.stdout
    test = _run(fixture_project, "render", "--stack", "test", "--out", str(tmp_path / "test"))
    assert test.returncode == 0, test.stderr
    done = _run(fixture_project, "render", "--stack", "prod", "--out", str(tmp_path / "prod"), "--promoted-from", "test")
    assert done.returncode == 0, done.stderr
    images = set(json.loads((tmp_path / "test" / "outputs.json").read_text())["images"].values())
    services = [o for o in yaml.safe_load_all((tmp_path / "prod" / "manifests.yaml").read_text())
                if o and o["kind"] == "StatefulService"]
    used = {c["image"] for o in services for c in o["spec"]["containers"]}
    assert services and used == images  # every prod entity runs exactly test's references


def test_a_promoted_stack_renders_as_it_is(tmp_path, monkeypatch):
    shutil.copy(stacks.DIR / "Pulumi.prod.yaml", tmp_path / "Pulumi.prod.yaml")
    monkeypatch.setattr(render, "ROOT", tmp_path)
    assert cli._never_promoted("prod")
    stacks.write(tmp_path)
    assert not cli._never_promoted("prod")
