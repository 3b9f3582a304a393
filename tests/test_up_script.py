"""scripts/up.sh, walked end to end with fake `kubectl`, `pulumi` and `docker` on a PATH of their own
(each logs its argv): every kubectl call carries the stack's kube context, the checks run before
any slow work and list every missing piece with its fix, and nothing is deployed then.

The script runs in a copy of the repository (its stack files edited per case) whose `.venv`
delegates to this interpreter; its requirements stamp is current, so pip is not run unless a case
asks for it."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cloudstation_tools import preflight
from cloudstation_tools.cli import port_forwards
from cloudstation_tools.render import validate_config
from cloudstation_tools.validate import SUPPORTED_VERSIONS
from tests import stacks

SUPPORTED_MINOR = int(SUPPORTED_VERSIONS[-1].split(".")[1])
TOO_OLD_MINOR = int(SUPPORTED_VERSIONS[0].split(".")[1]) - 2
SYSTEM_TOOLS = ["dirname", "cat", "sleep", "pkill", "grep", "sed", "awk", "tee", "mkdir", "rm", "cp"]
"""What the scripts, the docs' blocks and the stubs call besides the tools under test (bash is named
absolutely)."""
BASH = shutil.which("bash")

KUBECTL = r"""#!{bash}
line=kubectl; for a in "$@"; do printf -v q ' %q' "$a"; line+="$q"; done; printf '%s\n' "$line" >> "$FAKE_LOG"
context=""; prev=""
for a in "$@"; do [ "$prev" = --context ] && context="$a"; prev="$a"; done
if [ -n "$context" ] && [[ " $FAKE_KNOWN_CONTEXTS " != *" $context "* ]]; then
  echo "error: context was not found for specified context: $context" >&2; exit 1
fi
case " $* " in
  *" config current-context "*)
    [ -n "$FAKE_CURRENT_CONTEXT" ] || {{ echo "error: current-context is not set" >&2; exit 1; }}
    echo "$FAKE_CURRENT_CONTEXT" ;;
  *" get --raw /readyz "*)
    [ "$FAKE_CLUSTER_DOWN" = 1 ] && {{ echo "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?" >&2; exit 1; }}
    echo ok ;;
  *" version -o json "*) printf '%s\n' "$FAKE_VERSION_JSON" ;;
  *" get configmap "*) printf '%s\n' "$FAKE_CONFIGMAPS_JSON" ;;
  *" port-forward "*) exit 0 ;;
  *" delete "*|*" get "*) exit 0 ;;   # the docs' teardown commands (tests/test_workflow_docs.py)
  *) echo "fake kubectl: unexpected call: $*" >&2; exit 3 ;;
esac
"""

PULUMI = r"""#!{bash}
line=pulumi; for a in "$@"; do printf -v q ' %q' "$a"; line+="$q"; done; printf '%s\n' "$line" >> "$FAKE_LOG"
case "$1" in
  version) echo v3.272.0 ;;
  stack) exit 0 ;;
  up)
    {{ printf 'env'; printf ' %q' "PULUMI_BACKEND_URL=$PULUMI_BACKEND_URL" "PULUMI_CONFIG_PASSPHRASE_FILE=$PULUMI_CONFIG_PASSPHRASE_FILE"; echo; }} >> "$FAKE_LOG"
    [ -z "${{FAKE_UP_FAILS:-}}" ] || {{ echo "fake pulumi: up failed (FAKE_UP_FAILS)" >&2; exit 5; }}
    # The port-forwards start in the background: wait (bounded) until each has been tried once.
    for _ in $(seq 1 100); do
      [ "$(grep -c ' port-forward ' "$FAKE_LOG")" -ge "$FAKE_FORWARDS" ] && exit 0
      sleep 0.1
    done
    echo "fake pulumi: the port-forwards never started" >&2; exit 4 ;;
  *) echo "fake pulumi: unexpected call: $*" >&2; exit 3 ;;
esac
"""

DOCKER = r"""#!{bash}
line=docker; for a in "$@"; do printf -v q ' %q' "$a"; line+="$q"; done; printf '%s\n' "$line" >> "$FAKE_LOG"
case "$1" in
  info)
    [ "$FAKE_DOCKER_DOWN" = 1 ] && {{ echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2; exit 1; }}
    echo 28.0.1 ;;
  context) echo default ;;
  *) echo "fake docker: unexpected call: $*" >&2; exit 3 ;;
esac
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def version_json(minor: int) -> str:
    return json.dumps({
        "clientVersion": {"major": "1", "minor": str(minor), "gitVersion": f"v1.{minor}.0"},
        "serverVersion": {"major": "1", "minor": f"{minor}+", "gitVersion": f"v1.{minor}.2-eks-1234"},
    })


def configmaps_json(mode: str) -> str:
    conf = f"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: \"{mode}\"\n"
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
         "data": {"config.conf": conf, "kubeconfig.conf": "apiVersion: v1\nkind: Config\n"}},
    ]})


class Sandbox:
    def __init__(self, tmp_path: Path):
        self.repo = tmp_path / "repo"
        stacks.copy_repository(self.repo, also_ignored={"bench"})  # the fixture pair as its stack files
        venv = self.repo / ".venv" / "bin"
        venv.mkdir(parents=True)
        _executable(venv / "python", f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
        self.log = tmp_path / "calls.log"
        self.log.touch()
        _executable(venv / "pip", f"#!/bin/sh\necho \"pip $*\" >> {shlex.quote(str(self.log))}\n")
        self.stamp(current=True)
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        _executable(self.bin / "python3", f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
        for tool in SYSTEM_TOOLS + ["seq"]:
            found = shutil.which(tool)
            assert found, f"{tool} is needed on PATH to run this test"
            (self.bin / tool).symlink_to(found)
        self.env = {
            "PATH": str(self.bin), "HOME": str(tmp_path / "home"), "LANG": "C.UTF-8", "FAKE_LOG": str(self.log),
            "FAKE_CURRENT_CONTEXT": "kind-current", "FAKE_KNOWN_CONTEXTS": "kind-current kind-deploy",
            "FAKE_VERSION_JSON": version_json(SUPPORTED_MINOR), "FAKE_CONFIGMAPS_JSON": configmaps_json("iptables"),
        }

    def stamp(self, current: bool) -> None:
        path = self.repo / ".venv" / ".requirements.sha256"
        if current:
            path.write_text(hashlib.sha256((self.repo / "requirements.txt").read_bytes()).hexdigest() + "\n")
        else:
            path.unlink(missing_ok=True)

    def tools(self, *names: str) -> None:
        for name, text in {"kubectl": KUBECTL, "pulumi": PULUMI, "docker": DOCKER}.items():
            if name in names:
                _executable(self.bin / name, text.format(bash=BASH))

    def set_config(self, stack: str, key: str, value) -> None:
        path = self.repo / f"Pulumi.{stack}.yaml"
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        document["config"][key] = value
        path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")

    def build_locally(self, stack: str = "test") -> None:
        """`platform.builds.mode: local`: pulumi-docker builds with this machine's Docker engine, which
        preflight then checks (the default, armada, builds in the cluster: docs/builds.md)."""
        path = self.repo / f"Pulumi.{stack}.yaml"
        platform = yaml.safe_load(path.read_text(encoding="utf-8"))["config"]["cloudstation:platform"]
        self.set_config(stack, "cloudstation:platform", {**platform, "builds": {"mode": "local"}})

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [BASH, "scripts/up.sh", *args], cwd=self.repo, env={**self.env, **env},
            capture_output=True, text=True, timeout=300,
        )

    def calls(self, tool: str) -> list[list[str]]:
        lines = [shlex.split(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [line[1:] for line in lines if line[0] == tool]

    def forwards(self, stack: str) -> list[str]:
        return port_forwards(validate_config(stack, self.repo))


@pytest.fixture
def sandbox(tmp_path) -> Sandbox:
    return Sandbox(tmp_path)


def _context_of(argv: list[str]) -> str | None:
    return argv[argv.index("--context") + 1] if "--context" in argv else None


def test_every_kubectl_call_uses_the_stack_context(sandbox):
    sandbox.tools("kubectl", "pulumi", "docker")
    sandbox.set_config("test", "cloudstation:kubernetes", {"context": "kind-deploy"})
    forwards = sandbox.forwards("test")
    assert forwards, "the test stack needs port-forwards (registry pushes, Armada queues)"
    done = sandbox.run("test", FAKE_FORWARDS=str(len(forwards)))
    assert done.returncode == 0, done.stderr

    kubectl = sandbox.calls("kubectl")
    assert kubectl
    assert [_context_of(argv) for argv in kubectl] == ["kind-deploy"] * len(kubectl), kubectl
    assert ["config", "current-context"] not in kubectl  # the current context (kind-current) is not consulted
    assert any("/readyz" in argv for argv in kubectl) and any("version" in argv for argv in kubectl)
    forwarded = [argv for argv in kubectl if "port-forward" in argv]
    assert sorted(" ".join([argv[argv.index("-n") + 1], argv[-2][len("svc/"):], argv[-1]]) for argv in forwarded) \
        == sorted(forwards)

    # Checks first, then the stack, then `pulumi up` with the local backend and its passphrase.
    pulumi = sandbox.calls("pulumi")
    assert [argv[0] for argv in pulumi] == ["version", "stack", "up"]
    assert pulumi[-1][:4] == ["up", "--stack", "test", "--yes"]
    assert sandbox.calls("docker") == []  # builds.mode armada (the default here): no Docker engine (docs/builds.md)
    state = sandbox.repo / ".pulumi-state"
    assert sandbox.calls("env") == [[f"PULUMI_BACKEND_URL=file://{state.resolve()}",
                                     f"PULUMI_CONFIG_PASSPHRASE_FILE={(state / 'passphrase').resolve()}"]]
    assert stat.S_IMODE((state / "passphrase").stat().st_mode) == 0o600
    assert not any(line.startswith("pip ") for line in sandbox.log.read_text().splitlines())  # stamp current


def test_check_runs_first_and_a_problem_stops_everything(sandbox):
    """`cloudstation check --stack STACK` before anything else: a stack-file problem is printed with its
    file and line, and nothing is checked, installed into the cluster or deployed after it."""
    sandbox.tools("kubectl", "pulumi", "docker")
    platform = yaml.safe_load((sandbox.repo / "Pulumi.test.yaml").read_text(encoding="utf-8"))["config"][
        "cloudstation:platform"]
    platform["registry"]["resources"] = {"cpuRequest": "2", "cpuLimit": "1"}
    sandbox.set_config("test", "cloudstation:platform", platform)
    done = sandbox.run("test")
    assert done.returncode == 1
    text = (sandbox.repo / "Pulumi.test.yaml").read_text(encoding="utf-8")
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "cpuRequest" in row)
    assert f"Pulumi.test.yaml:{line}: error: cloudstation:platform.registry.resources.cpuRequest: '2'" in done.stderr
    assert "nothing was deployed" in done.stderr
    assert sandbox.calls("kubectl") == [] and sandbox.calls("pulumi") == []


def test_a_deployment_records_what_it_deployed(sandbox):
    """After a successful `pulumi up`, the render it deployed is `.cloudstation/deployed/<stack>/`: the
    baseline of `cloudstation diff` and of check's data-left-behind warning (cloudstation_tools/baseline.py)."""
    sandbox.tools("kubectl", "pulumi", "docker")
    done = sandbox.run("test", FAKE_FORWARDS=str(len(sandbox.forwards("test"))))
    assert done.returncode == 0, done.stderr
    deployed = sandbox.repo / ".cloudstation" / "deployed" / "test"
    assert json.loads((deployed / "resources.json").read_text())
    # `pulumi up` failed: the previous record stays.
    (deployed / "resources.json").write_text("[]")
    done = sandbox.run("test", FAKE_UP_FAILS="1")
    assert done.returncode != 0 and "fake pulumi: up failed" in done.stderr, done.stderr
    assert (deployed / "resources.json").read_text() == "[]"


def test_without_a_stack_context_the_current_context_is_pinned(sandbox):
    sandbox.tools("kubectl", "pulumi", "docker")
    config = validate_config("test", sandbox.repo)
    assert config.kubernetes.context is None, "the fixture stack file (as the example) sets no context"
    done = sandbox.run("test", FAKE_FORWARDS=str(len(sandbox.forwards("test"))))
    assert done.returncode == 0, done.stderr
    kubectl = sandbox.calls("kubectl")
    assert kubectl[0] == ["config", "current-context"]
    assert [_context_of(argv) for argv in kubectl[1:]] == ["kind-current"] * (len(kubectl) - 1)
    assert any("port-forward" in argv for argv in kubectl)


def test_the_registry_is_port_forwarded_only_where_pulumi_up_reaches_it_at_localhost(sandbox):
    """Armada builds reach the registry through their own port-forward through the Kubernetes API
    (components/kube_tunnel.py, infra/builds.py `tunnels_to_registry`): up.sh starts no registry
    forward for them. Local builds push with the Docker engine through one, and an explicit
    loopback pushHost keeps one too."""
    from infra.delivery import REGISTRY_NAME

    def registry_forwards() -> list[str]:
        config = validate_config("test", sandbox.repo)
        return [f for f in port_forwards(config) if f.split()[:2] == [config.platform.namespace, REGISTRY_NAME]]

    config = validate_config("test", sandbox.repo)
    assert config.platform.build_mode == "armada" and not config.platform.registry.push_host
    assert registry_forwards() == []
    sandbox.tools("kubectl", "pulumi", "docker")
    done = sandbox.run("test", FAKE_FORWARDS=str(len(sandbox.forwards("test"))))
    assert done.returncode == 0, done.stderr
    forwarded = [argv for argv in sandbox.calls("kubectl") if "port-forward" in argv]
    assert forwarded and f"svc/{REGISTRY_NAME}" not in [argv[-2] for argv in forwarded], forwarded

    node_port = config.platform.registry.node_port
    platform = yaml.safe_load((sandbox.repo / "Pulumi.test.yaml").read_text(encoding="utf-8"))["config"][
        "cloudstation:platform"]
    sandbox.set_config("test", "cloudstation:platform",
                       {**platform, "registry": {**platform["registry"], "pushHost": f"localhost:{node_port}"}})
    assert registry_forwards() == [f"{config.platform.namespace} {REGISTRY_NAME} {node_port}:5000"]
    sandbox.set_config("test", "cloudstation:platform", platform)
    sandbox.build_locally()
    assert registry_forwards() == [f"{config.platform.namespace} {REGISTRY_NAME} {node_port}:5000"]


def _problems(stderr: str) -> str:
    assert "nothing was deployed" in stderr, stderr
    return stderr


def test_missing_pieces_are_listed_together_with_their_fixes(sandbox):
    # No Pulumi CLI, no docker, and a cluster that is too old and runs kube-proxy in IPVS mode.
    sandbox.tools("kubectl")
    sandbox.set_config("test", "cloudstation:kubernetes", {"context": "kind-deploy"})
    sandbox.build_locally()
    done = sandbox.run(
        "test", FAKE_VERSION_JSON=version_json(TOO_OLD_MINOR), FAKE_CONFIGMAPS_JSON=configmaps_json("ipvs"),
    )
    assert done.returncode == 1
    text = _problems(done.stderr)
    assert "4 problems" in text
    assert "pulumi: not found on PATH" in text and "install the Pulumi CLI" in text
    assert "docker: not found on PATH" in text and "install Docker" in text
    assert f"Kubernetes 1.{TOO_OLD_MINOR}" in text and f"{SUPPORTED_VERSIONS[0]} to {SUPPORTED_VERSIONS[-1]}" in text
    assert "ipvs mode" in text and "mode: iptables" in text and "platform.registry.mode: external" in text
    assert all(_context_of(argv) == "kind-deploy" for argv in sandbox.calls("kubectl"))
    assert not any("port-forward" in argv for argv in sandbox.calls("kubectl"))
    # Stopped before the render and the backend (check's render may have written generated Dockerfiles).
    assert not (sandbox.repo / ".pulumi-state").exists() and not (sandbox.repo / ".cloudstation" / "rendered").exists()


def test_unreachable_cluster_and_engine_stop_before_pulumi_up(sandbox):
    sandbox.tools("kubectl", "pulumi", "docker")
    sandbox.stamp(current=False)  # requirements changed: installed once, before the checks
    sandbox.build_locally()
    done = sandbox.run("test", FAKE_CLUSTER_DOWN="1", FAKE_DOCKER_DOWN="1")
    assert done.returncode == 1
    text = _problems(done.stderr)
    assert "2 problems" in text
    assert "kube context 'kind-current' (kubectl's current context) did not answer" in text
    assert "connection to the server 127.0.0.1:6443 was refused" in text and "cluster-info" in text
    assert "Docker engine does not answer `docker info`" in text and "DOCKER_HOST" in text
    assert [argv[0] for argv in sandbox.calls("pulumi")] == ["version"]  # no `stack select`, no `up`
    assert sandbox.log.read_text().splitlines()[0] == "pip install -q --disable-pip-version-check -r requirements.txt"
    assert (sandbox.repo / ".venv" / ".requirements.sha256").is_file()


def test_unknown_context_bad_config_and_missing_kubectl(sandbox):
    sandbox.tools("pulumi", "kubectl")
    stacks.write(sandbox.repo)  # prod as its first promotion writes it (tests/stacks/)
    sandbox.set_config("prod", "cloudstation:kubernetes", {"context": "kind-gone"})
    done = sandbox.run("prod")
    assert done.returncode == 1
    assert "kube context 'kind-gone' (cloudstation:kubernetes.context in Pulumi.prod.yaml) is not in your kubeconfig" \
        in _problems(done.stderr)
    assert "docker" not in done.stderr  # prod never builds

    # A stack-file problem stops `cloudstation check`, first, with its line (the tools come after).
    (sandbox.bin / "kubectl").unlink()
    sandbox.set_config("prod", "cloudstation:kubernetes", {"context": "kind-deploy", "contxt": "x"})
    done = sandbox.run("prod")
    assert done.returncode == 1 and "nothing was deployed" in done.stderr
    assert "Pulumi.prod.yaml:" in done.stderr and "error: cloudstation:kubernetes.contxt: unknown key" in done.stderr
    sandbox.set_config("prod", "cloudstation:kubernetes", {"context": "kind-deploy"})
    done = sandbox.run("prod")
    text = _problems(done.stderr)
    assert done.returncode == 1 and "1 problem" in text
    assert "kubectl: not found on PATH" in text and "install kubectl" in text


# --- the parsers behind the checks ---------------------------------------------------------------


def test_server_version_reads_provider_suffixes():
    assert preflight.server_version(version_json(35)) == (1, 35)
    assert preflight.server_version(json.dumps({"serverVersion": {"major": "1", "minor": "34+"}})) == (1, 34)
    assert preflight.server_version(json.dumps({"clientVersion": {"gitVersion": "v1.35.0"}})) is None
    assert preflight.server_version("not json") is None


def test_kube_proxy_mode_from_kubeadm_and_eks_configmaps():
    assert preflight.kube_proxy_mode(configmaps_json("ipvs")) == "ipvs"
    assert preflight.kube_proxy_mode(configmaps_json("")) == ""  # default: iptables on Linux
    eks = {"kind": "ConfigMap", "data": {"config": "kind: KubeProxyConfiguration\nmode: nftables\n"}}
    assert preflight.kube_proxy_mode(json.dumps(eks)) == "nftables"
    assert preflight.kube_proxy_mode("") is None  # --ignore-not-found: neither ConfigMap exists
    assert "" in preflight.LOCALHOST_NODEPORT_MODES and "ipvs" not in preflight.LOCALHOST_NODEPORT_MODES


@pytest.mark.parametrize("stack", ["test", "prod"])
def test_docker_is_checked_exactly_when_the_stack_builds(stack):
    config = stacks.validate_config(stack)  # prod as its first promotion writes it
    from infra.delivery import all_entities

    # With this machine's Docker engine only in `local` mode (armada builds in the cluster: docs/builds.md).
    expected = (config.environment.value == "test" and config.platform.build_mode == "local"
                and any(e.image is None for _, e in all_entities(config)))
    assert preflight.builds_images(config) is expected
    test = stacks.validate_config("test")
    assert preflight.builds_images(test) is False and test.platform.build_mode == "armada"
    local = test.model_copy(update={"platform": test.platform.model_copy(
        update={"builds": test.platform.builds.model_copy(update={"mode": "local"})})})
    assert preflight.builds_images(local) is True
