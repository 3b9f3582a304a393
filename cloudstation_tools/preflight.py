"""What `scripts/up.sh` checks before any slow work, all at once: the stack file, the Pulumi CLI,
kubectl, the cluster of the stack's kube context (reachable, Kubernetes version, kube-proxy mode)
and, when the stack builds entity images, the Docker engine. Every problem comes with its fix.

    python -m infra preflight --stack STACK                  all checks; prints the kube context
    python -m infra preflight --stack STACK --context-only   only the kube context (for kubectl)

The kube context is `cloudstation:kubernetes.context`, else kubectl's current context, resolved
once: every kubectl call of `scripts/up.sh` passes it (`--context`), so the port-forwards reach
the cluster `pulumi up` deploys to.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import yaml

from infra.config import ConfigError, Environment, StackConfig

PROBE_SECONDS = 20
"""Longest wait for one probe: a cluster or engine that does not answer is reported, not waited for."""
REQUEST_TIMEOUT = "--request-timeout=10s"

INSTALL = {
    "pulumi": "install the Pulumi CLI (https://www.pulumi.com/docs/iac/download-install/), "
              "version {sdk} or newer (the SDK version in requirements.txt)",
    "kubectl": "install kubectl (https://kubernetes.io/docs/tasks/tools/), a version within one minor "
               "of the cluster's",
    "docker": "install Docker (https://docs.docker.com/engine/install/), which builds the entity images with "
              "platform.builds.mode: local; or build them in the cluster instead (builds.mode: armada, with this "
              "stack's Armada and managed registry: docs/builds.md)",
}
KUBE_PROXY_CONFIGMAPS = ("kube-proxy", "kube-proxy-config")
"""kube-system ConfigMaps holding a KubeProxyConfiguration: kubeadm's (and kind's) `kube-proxy`, key
`config.conf` (kubernetes/kubernetes cmd/kubeadm/app/constants: KubeProxyConfigMap,
KubeProxyConfigMapKey), and EKS's `kube-proxy-config`, key `config`. k3s and kube-proxy-less
clusters have neither: then the mode cannot be told."""
LOCALHOST_NODEPORT_MODES = ("", "iptables")
"""kube-proxy modes that forward `localhost:<nodePort>` on the node (`""` is the default, iptables on
Linux in Kubernetes 1.33 to 1.37); IPVS and nftables do not (docs/registry.md)."""


@dataclass(frozen=True)
class Problem:
    what: str
    fix: str


@dataclass
class Report:
    stack: str
    context: Optional[str] = None
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, what: str, fix: str) -> None:
        self.problems.append(Problem(what, fix))

    def text(self) -> str:
        lines = [f"note: {note}" for note in self.notes]
        if self.problems:
            count = len(self.problems)
            lines.append(
                f"stack {self.stack}: {count} problem{'s' if count > 1 else ''} to fix before deploying "
                "(nothing was deployed):"
            )
            for number, problem in enumerate(self.problems, 1):
                what = problem.what.replace("\n", "\n     ")
                lines.append(f"  {number}. {what}\n     fix: {problem.fix}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Result:
    returncode: Optional[int]
    """None when the command did not finish within PROBE_SECONDS."""
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def reason(self) -> str:
        if self.returncode is None:
            return f"no answer within {PROBE_SECONDS} s"
        text = (self.stderr.strip() or self.stdout.strip() or f"exit status {self.returncode}").splitlines()
        return text[-1][:300]


Runner = Callable[[Sequence[str]], Result]


def run(argv: Sequence[str]) -> Result:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=PROBE_SECONDS, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return Result(None)
    except OSError as error:
        return Result(127, stderr=str(error))
    return Result(done.returncode, done.stdout, done.stderr)


# --- parsers (pure) ------------------------------------------------------------------------------


def server_version(version_json: str) -> Optional[tuple[int, int]]:
    """(major, minor) of `kubectl version -o json`'s serverVersion; minor may read "33+" (EKS, GKE)."""
    try:
        server = (json.loads(version_json) or {}).get("serverVersion") or {}
    except (ValueError, AttributeError):
        return None
    match = re.match(r"v?(\d+)\.(\d+)", str(server.get("gitVersion") or ""))
    if match:
        return int(match.group(1)), int(match.group(2))
    major, minor = (re.match(r"\d+", str(server.get(key) or "")) for key in ("major", "minor"))
    return (int(major.group()), int(minor.group())) if major and minor else None


def kube_proxy_mode(configmaps_json: str) -> Optional[str]:
    """The `mode` of the KubeProxyConfiguration in `kubectl get configmap ... -o json` output (one
    ConfigMap or a List); None when there is none."""
    try:
        data = json.loads(configmaps_json) if configmaps_json.strip() else {}
    except ValueError:
        return None
    items = data.get("items", [data]) if isinstance(data, dict) else []
    for item in items:
        for value in ((item or {}).get("data") or {}).values():
            try:
                document = yaml.safe_load(value)
            except yaml.YAMLError:
                continue
            if isinstance(document, dict) and document.get("kind") == "KubeProxyConfiguration":
                return str(document.get("mode") or "")
    return None


def _version_number(text: str) -> tuple[int, ...]:
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(part) for part in match.groups()) if match else ()


def builds_images(config: StackConfig) -> bool:
    """Whether `pulumi up` builds entity images with this machine's Docker engine: the test stack in
    `platform.builds.mode: local`, for each entity without `image` (infra/delivery.py
    `entity_images`); `armada` builds in the cluster (docs/builds.md)."""
    from infra.delivery import all_entities

    return (config.environment is Environment.TEST and config.platform.build_mode == "local"
            and any(entity.image is None for _, entity in all_entities(config)))


def needs_localhost_nodeports(config: StackConfig) -> bool:
    """Nodes pull from `localhost:<nodePort>` (the managed registry, or another stack's: shared)."""
    return config.platform.registry.mode in ("managed", "shared")


# --- checks --------------------------------------------------------------------------------------


def resolve_context(config: Optional[StackConfig], runner: Runner = run) -> tuple[Optional[str], Optional[str]]:
    """(context, why not): the stack's `kubernetes.context`, else kubectl's current context."""
    if config is not None and config.kubernetes.context:
        return config.kubernetes.context, None
    current = runner(["kubectl", "config", "current-context"])
    if current.ok and current.stdout.strip():
        return current.stdout.strip(), None
    return None, current.reason()


def check(
    stack: str, root: Path, env: Mapping[str, str] = os.environ,
    which: Callable[[str], Optional[str]] = shutil.which, runner: Runner = run,
) -> Report:
    from cloudstation_tools.render import validate_config

    report = Report(stack)
    source = f"Pulumi.{stack}.yaml"
    context_key = f"cloudstation:kubernetes.context in {source}"

    config: Optional[StackConfig] = None
    try:
        config = validate_config(stack, root)
    except ConfigError as error:
        report.add(str(error), "correct those keys (docs/config-reference.md lists every key, type and default)")
    except FileNotFoundError as error:
        report.add(str(error), f"create {source} (start from Pulumi.test.yaml) or name an existing stack")

    sdk = metadata.version("pulumi")
    if not which("pulumi"):
        report.add("pulumi: not found on PATH", INSTALL["pulumi"].format(sdk=sdk))
    else:
        cli = runner(["pulumi", "version"])
        found, wanted = _version_number(cli.stdout), _version_number(sdk)
        if cli.ok and found and wanted and found < wanted:
            report.notes.append(
                f"the Pulumi CLI is {cli.stdout.strip()}, older than the SDK {sdk} in requirements.txt: "
                "update it if `pulumi up` fails on an unknown feature"
            )

    has_kubectl = bool(which("kubectl"))
    if not has_kubectl:
        report.add("kubectl: not found on PATH", INSTALL["kubectl"])
    elif config is None:
        report.notes.append("the cluster is checked once the stack file validates (it names the kube context)")
    elif config.kubernetes.render_yaml_to_directory:
        report.notes.append("kubernetes.renderYamlToDirectory is set: manifests are written, no cluster is checked")
    else:
        context, why = resolve_context(config, runner)
        report.context = context
        if context is None:
            report.add(
                f"no kube context: {source} sets no cloudstation:kubernetes.context and kubectl has no "
                f"current context ({why})",
                f"set {context_key}, or `kubectl config use-context NAME` (`kubectl config get-contexts` lists them)",
            )
        else:
            _check_cluster(report, config, context, context_key, runner, env)

    if config is not None and builds_images(config):
        _check_docker(report, env, which, runner, f"this stack builds entity images here: {config.platform.build_mode_why[2]}")
    return report


def _check_cluster(
    report: Report, config: StackConfig, context: str, context_key: str, runner: Runner, env: Mapping[str, str]
) -> None:
    from cloudstation_tools.validate import SUPPORTED_VERSIONS

    kubectl = ["kubectl", "--context", context, REQUEST_TIMEOUT]
    where = f"kube context '{context}'" + (f" ({context_key})" if config.kubernetes.context else " (kubectl's current context)")
    ready = runner([*kubectl, "get", "--raw", "/readyz"])
    if not ready.ok:
        # client-go tools/clientcmd/validation.go: errContextNotFound.
        if "context was not found" in ready.stderr:
            report.add(
                f"{where} is not in your kubeconfig ({env.get('KUBECONFIG') or '~/.kube/config'})",
                f"correct {context_key} or add the context to the kubeconfig (`kubectl config get-contexts` lists them)",
            )
        else:
            report.add(
                f"the cluster of {where} did not answer `kubectl get --raw /readyz`: {ready.reason()}",
                f"start the cluster or connect to its network, check the credentials with "
                f"`kubectl --context {context} cluster-info`, or deploy to another context ({context_key})",
            )
        return

    low, high = SUPPORTED_VERSIONS[0], SUPPORTED_VERSIONS[-1]
    answer = runner([*kubectl, "version", "-o", "json"])
    version = server_version(answer.stdout)
    if version is None:
        report.notes.append(f"the Kubernetes version of {where} could not be read ({answer.reason()})")
    elif f"{version[0]}.{version[1]}" not in SUPPORTED_VERSIONS:
        report.add(
            f"the cluster of {where} runs Kubernetes {version[0]}.{version[1]}; supported: {low} to {high}",
            f"use a cluster running Kubernetes {low} to {high} (every object is validated against those "
            "versions' schemas, cloudstation_tools/validate.py)",
        )

    if not needs_localhost_nodeports(config):
        return
    configmaps = runner(
        [*kubectl, "-n", "kube-system", "get", "configmap", *KUBE_PROXY_CONFIGMAPS, "--ignore-not-found", "-o", "json"]
    )
    mode = kube_proxy_mode(configmaps.stdout) if configmaps.ok else None
    registry = f"platform.registry.mode: {config.platform.registry.mode}"
    if mode is None:
        why = "no kube-system ConfigMap kube-proxy" if configmaps.ok else configmaps.reason()
        report.notes.append(
            f"kube-proxy's mode could not be told ({why}); with {registry} nodes pull from "
            "localhost:<nodePort>, which needs kube-proxy in iptables mode (docs/registry.md)"
        )
    elif mode not in LOCALHOST_NODEPORT_MODES:
        report.add(
            f"kube-proxy runs in {mode} mode: nodes cannot pull from the registry at localhost:<nodePort> "
            f"({registry}; localhost NodePorts work in iptables mode only)",
            "set `mode: iptables` in kube-proxy's configuration (kube-system ConfigMap kube-proxy) and restart "
            "its DaemonSet, or use an external registry (platform.registry.mode: external, docs/registry.md)",
        )


def _check_docker(report: Report, env: Mapping[str, str], which: Callable[[str], Optional[str]], runner: Runner,
                  why: str) -> None:
    if not which("docker"):
        report.add(f"docker: not found on PATH ({why})", INSTALL["docker"])
        return
    info = runner(["docker", "info", "--format", "{{.ServerVersion}}"])
    if not info.ok:
        report.add(
            f"the Docker engine does not answer `docker info`: {info.reason()} ({why})",
            "start Docker (`sudo systemctl start docker`, or Docker Desktop), or point DOCKER_HOST at a running engine",
        )
        return
    # pulumi-docker talks to DOCKER_HOST, else the default socket, never to the docker CLI's
    # current context (pulumi/pulumi-docker provider/provider.go `setConfiguration`, and
    # provider/image.go `configureDockerClient`: client.FromEnv).
    if not env.get("DOCKER_HOST"):
        current = runner(["docker", "context", "show"])
        name = current.stdout.strip()
        if current.ok and name and name != "default":
            report.notes.append(
                f"the docker CLI uses the context '{name}', but pulumi-docker uses DOCKER_HOST or the default "
                f"socket: if the build cannot reach the engine, export DOCKER_HOST=\"$(docker context inspect "
                f"{name} --format '{{{{.Endpoints.docker.Host}}}}')\""
            )


def context_only(stack: str, root: Path, runner: Runner = run) -> tuple[Optional[str], Optional[str]]:
    from cloudstation_tools.render import validate_config

    return resolve_context(validate_config(stack, root), runner)
