"""After `scripts/up.sh`, the project's own commands find the backend and passphrase it deployed with
(cloudstation_tools/local_backend.py): `python -m infra promote` reads the test stack's outputs there, through the
Pulumi CLI (which needs the passphrase: a passphrase stack's outputs are decrypted with it, pulumi/pulumi
pkg/resource/stack/deployment.go `DeserializeStackOutputs`) or from the checkpoint; `source
scripts/env.sh` gives plain `pulumi` commands the same two variables; a backend or passphrase the
user chose always wins, and the generated passphrase is never pointed at another backend."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from cloudstation_tools import cli, local_backend, promote, state_backend
from tests.conftest import ROOT

VARIABLES = ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def project(tmp_path):
    """A project directory after `scripts/up.sh` deployed test: Pulumi.yaml and the local state."""
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    local_backend.create(tmp_path, env={})
    return tmp_path


def test_defaults_after_up(project):
    state = (project / ".pulumi-state").resolve()
    assert local_backend.defaults(project, {}) == {
        "PULUMI_BACKEND_URL": f"file://{state}",
        "PULUMI_CONFIG_PASSPHRASE_FILE": str(state / "passphrase"),
    }
    assert stat.S_IMODE((state / "passphrase").stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert len((state / "passphrase").read_text().strip()) >= 32


def test_nothing_without_local_state(tmp_path):
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    assert local_backend.defaults(tmp_path, {}) == {}


def test_the_users_choices_win(project):
    state = (project / ".pulumi-state").resolve()
    # Another backend: neither variable, so the generated passphrase never meets its stacks.
    assert local_backend.defaults(project, {"PULUMI_BACKEND_URL": "s3://bucket/cloudstation"}) == {}
    # Their own passphrase (even empty: the CLI counts a present PULUMI_CONFIG_PASSPHRASE).
    assert local_backend.defaults(project, {"PULUMI_CONFIG_PASSPHRASE": ""}) == {"PULUMI_BACKEND_URL": f"file://{state}"}
    assert local_backend.defaults(project, {"PULUMI_CONFIG_PASSPHRASE_FILE": "/elsewhere"}) == {
        "PULUMI_BACKEND_URL": f"file://{state}"
    }
    # The same local backend spelled by hand still gets its passphrase; an empty _FILE is unset.
    assert local_backend.defaults(project, {"PULUMI_BACKEND_URL": f"file://{state}/", "PULUMI_CONFIG_PASSPHRASE_FILE": ""}) \
        == {"PULUMI_CONFIG_PASSPHRASE_FILE": str(state / "passphrase")}
    # A backend named in Pulumi.yaml (the CLI's second choice after the variable).
    (project / "Pulumi.yaml").write_text((project / "Pulumi.yaml").read_text() + "backend:\n  url: s3://team\n")
    assert local_backend.defaults(project, {}) == {}


def test_create_keeps_and_never_regenerates_a_passphrase(tmp_path):
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    local_backend.create(tmp_path, env={"PULUMI_BACKEND_URL": "s3://bucket"})
    assert not (tmp_path / ".pulumi-state").exists()
    local_backend.create(tmp_path, env={})
    passphrase = tmp_path / ".pulumi-state" / "passphrase"
    first = passphrase.read_text()
    local_backend.create(tmp_path, env={})
    assert passphrase.read_text() == first
    # Stacks made with another passphrase: a new one would not open their secrets.
    passphrase.unlink()
    stacks = tmp_path / ".pulumi-state" / ".pulumi" / "stacks" / "cloudstation"
    stacks.mkdir(parents=True)
    (stacks / "test.json").write_text("{}")
    local_backend.create(tmp_path, env={})
    assert not passphrase.exists()


def test_applied_restores_the_environment(project, clean_env):
    with local_backend.applied(project) as added:
        assert os.environ["PULUMI_BACKEND_URL"] == added["PULUMI_BACKEND_URL"]
    assert not any(name in os.environ for name in VARIABLES)


def _checkpoint(images: dict) -> dict:
    return {"version": 3, "checkpoint": {"latest": {"resources": [
        {"urn": "urn:pulumi:test::cloudstation::pulumi:pulumi:Stack::cloudstation-test",
         "type": state_backend.STACK_TYPE, "outputs": {"images": images}},
    ]}}}


IMAGES = {"shop/cart": "localhost:32000/shop/cart:abc@sha256:" + "1" * 64}


def _capture_promote(monkeypatch) -> list:
    """promote.promote replaced by its first step (the state read), recording what it found."""
    seen = []

    def first_step(source, target, *, root, backend, **_):
        seen.append(state_backend.stack_output(source, promote.IMAGES_OUTPUT, backend=backend, root=root))
        raise promote.PromotionRefused("stopped after reading the state (test)")

    monkeypatch.setattr(promote, "promote", first_step)
    return seen


def test_promote_reads_the_checkpoint_in_the_local_backend(project, clean_env, monkeypatch):
    stacks = project / ".pulumi-state" / ".pulumi" / "stacks" / "cloudstation"
    stacks.mkdir(parents=True)
    (stacks / "test.json").write_text(json.dumps(_checkpoint(IMAGES)))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)  # no Pulumi CLI: the checkpoint itself
    seen = _capture_promote(monkeypatch)
    assert cli.main(["promote", "--from", "test", "--to", "prod", "--root", str(project)]) == 1
    assert seen == [IMAGES]
    assert not any(name in os.environ for name in VARIABLES)


def test_promote_gives_the_pulumi_cli_the_backend_and_passphrase(project, clean_env, monkeypatch, tmp_path_factory):
    # A fake `pulumi` that answers `stack output` only with both variables, as the real CLI needs them.
    bin_dir = tmp_path_factory.mktemp("bin")
    fake = bin_dir / "pulumi"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "url, phrase = os.environ.get('PULUMI_BACKEND_URL'), os.environ.get('PULUMI_CONFIG_PASSPHRASE_FILE')\n"
        "if not url or not phrase or not open(phrase).read().strip():\n"
        "    sys.exit('error: passphrase must be set with PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE')\n"
        f"print(json.dumps({{'argv': sys.argv[1:], 'url': url, 'images': {IMAGES!r}}}))\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    seen = _capture_promote(monkeypatch)
    assert cli.main(["promote", "--from", "test", "--to", "prod", "--root", str(project)]) == 1
    answer = seen[0]
    assert answer["argv"] == ["stack", "output", "images", "--json", "--stack", "test"]
    assert answer["url"] == f"file://{(project / '.pulumi-state').resolve()}" and answer["images"] == IMAGES


def test_env_sh_exports_both_for_plain_pulumi_commands(project, tmp_path_factory):
    # env.sh in a project after up.sh: its own copy of the script, infra/ and cloudstation_tools/, and a .venv.
    (project / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "env.sh", project / "scripts" / "env.sh")
    for package in ("infra", "cloudstation_tools"):
        shutil.copytree(ROOT / package, project / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = project / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (venv / "python").chmod(0o755)
    bash = shutil.which("bash")
    show = "printf '%s\\n' \"$PULUMI_BACKEND_URL\" \"$PULUMI_CONFIG_PASSPHRASE_FILE\""
    script = f"source {project / 'scripts' / 'env.sh'}; {show}"
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # sourced from any directory
    state = (project / ".pulumi-state").resolve()

    done = subprocess.run([bash, "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"file://{state}", str(state / "passphrase")]
    assert "export PULUMI_BACKEND_URL=" in done.stderr and (state / "passphrase").read_text().strip() not in done.stderr

    # The user's own backend is left alone, and gets no passphrase of ours.
    done = subprocess.run([bash, "-c", script], cwd=elsewhere, env={**env, "PULUMI_BACKEND_URL": "s3://mine"},
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["s3://mine", ""] and "nothing to export" in done.stderr


def test_python_module_prints_exports_for_eval(project):
    done = subprocess.run(
        [sys.executable, "-m", "cloudstation_tools.local_backend", "--root", str(project)], cwd=ROOT, capture_output=True,
        text=True, env={k: v for k, v in os.environ.items() if k not in VARIABLES}, timeout=60,
    )
    state = (project / ".pulumi-state").resolve()
    assert done.stdout.splitlines() == [
        f"export PULUMI_BACKEND_URL=file://{state}", f"export PULUMI_CONFIG_PASSPHRASE_FILE={state / 'passphrase'}",
    ]
