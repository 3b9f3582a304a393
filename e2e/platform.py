"""One run of the scenario: a copy of the working tree, a cluster of one Kubernetes version, the
stand-ins behind the pods `pulumi up` talks to, and the commands a user runs, with the real tools.

The copy is of the tree the tier is run in (tracked and untracked files, not the ignored ones), so
edited stack files are what is tested; the scenario's own edits (promotion, pin bumps, an entity
change) happen in the copy only. Its `.venv` is the tree's own, linked, so `Pulumi.yaml`'s
`virtualenv: .venv` resolves as on a user's machine.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from e2e.cluster import Cluster, free_port
from e2e.standins import ClusterArmada, ClusterExecutor, RegistryStandIn

ROOT = Path(__file__).resolve().parent.parent
PASSPHRASE = "e2e-passphrase"
COMMAND_TIMEOUT = 30 * 60


def read_tools(path: Path) -> dict[str, Path]:
    """e2e/build-tools.sh's last lines: `<tool>=<bin dir>`."""
    tools = {}
    for line in path.read_text().splitlines():
        name, _, directory = line.partition("=")
        if directory:
            tools[name.strip()] = Path(directory.strip())
    return tools


def copy_tree(source: Path, target: Path) -> None:
    """The files git would commit, as they are now (untracked included, ignored excluded)."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=source,
                            capture_output=True, check=True).stdout
    # `.venv/` in .gitignore matches a directory only: a linked .venv would be listed.
    listed = b"\0".join(name for name in listed.split(b"\0") if name and name != b".venv")
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-cf", "-", "--null", "-T", "-"], cwd=source, input=listed, check=True,
                   stdout=open(target / ".copy.tar", "wb"))
    subprocess.run(["tar", "-xf", ".copy.tar"], cwd=target, check=True)
    (target / ".copy.tar").unlink()
    (target / ".venv").symlink_to((source / ".venv").resolve())


@dataclass
class Result:
    args: list[str]
    returncode: int
    output: str
    seconds: float
    stdout: str = ""

    def check(self) -> "Result":
        assert self.returncode == 0, f"`{' '.join(self.args)}` exited {self.returncode}:\n{self.tail()}"
        return self

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


@dataclass
class Platform:
    work: Path
    tools: dict[str, Path]
    kubernetes: str
    repo: Path = field(init=False)
    cluster: Cluster = field(init=False)
    registry: RegistryStandIn = field(init=False)
    armada: ClusterArmada = field(init=False)
    executor: ClusterExecutor = field(init=False)
    log: list[Result] = field(default_factory=list)

    def start(self) -> "Platform":
        self._lock()
        self.repo = self.work / "repo"
        copy_tree(ROOT, self.repo)
        for directory in ("state", "tmp"):
            (self.work / directory).mkdir(exist_ok=True)
        # Each part is known to `stop` before it starts: a stop while it starts (a signal) stops it too.
        self.cluster = Cluster(self.work / "cluster", self.tools[self.kubernetes], self.tools["etcd"],
                               self.tools["kwok"])
        self.cluster.start()
        # kubeadm's kube-proxy settings (iptables mode), which preflight reads to know nodes can pull
        # from localhost:<nodePort>; kwok has no kube-proxy of its own.
        self.cluster.apply({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
                            "data": {"config.conf": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                                                    "kind: KubeProxyConfiguration\nmode: iptables\n"}})
        self.registry = RegistryStandIn(self.cluster, self.tools["registry"], self.work / "registry")
        self.registry.start()
        config = self.config("test")
        armada_namespace = config.platform.armada.namespace
        self.armada = ClusterArmada(self.cluster, armada_namespace).__enter__()
        self.cluster.forward("armada-rest", [armada_namespace], 8080, int(self.armada.url.rsplit(":", 1)[1]))
        self.executor = ClusterExecutor(self.armada, self.cluster, self.registry, self.entity_source,
                                        lambda: self.executor_account(armada_namespace))
        return self

    def _lock(self) -> None:
        """One platform at a time on a machine: the stack files name fixed local ports
        (`armada.queueApi.url`, localhost:8080), which a second run's port-forwards would take over."""
        import fcntl
        path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cloudstation-e2e" / "run.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = path.open("w")
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)

    def stop(self) -> None:
        for part in ("executor", "armada"):
            with contextlib.suppress(Exception):
                getattr(self, part).__exit__(None, None, None)
        with contextlib.suppress(Exception):
            self.registry.stop()
        with contextlib.suppress(Exception):
            self.cluster.stop()
        if getattr(self, "_lock_file", None) is not None:
            self._lock_file.close()  # releases the lock
            self._lock_file = None

    # --- the program's view -------------------------------------------------------------------

    def config(self, stack: str):
        from cloudstation_tools.render import validate_config
        return validate_config(stack, self.repo)

    def entity_source(self, project: str, entity: str) -> tuple[Path, str]:
        """(source directory, Dockerfile text) of an entity in the copy, read at job time."""
        from infra import delivery
        config = self.config("test")
        for candidate_project, candidate in delivery.all_entities(config):
            if (candidate_project, candidate.name) == (project, entity):
                return (self.repo / candidate.source,
                        delivery.entity_dockerfile(self.repo, project, candidate, config.platform.image_mirror)[1])
        raise KeyError(f"{project}/{entity}")

    def executor_account(self, namespace: str) -> str:
        """The ServiceAccount the executor Deployment runs as."""
        deployments = self.cluster.api("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments")["items"]
        for deployment in deployments:  # components/armada/executor.py: armada-executor-<executor name>
            if deployment["metadata"]["name"].startswith("armada-executor-"):
                name = deployment["spec"]["template"]["spec"]["serviceAccountName"]
                return f"system:serviceaccount:{namespace}:{name}"
        raise LookupError(f"no executor Deployment in {namespace}")

    # --- commands -----------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        path = [str(self.tools[t]) for t in ("pulumi", "pulumi-kubernetes", self.kubernetes)]
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_", "KUBECONFIG", "CLOUDSTATION_"))},
            "PATH": os.pathsep.join([*path, os.environ.get("PATH", "")]),
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "PULUMI_HOME": str(self.work / "pulumi-home"),
            "PULUMI_BACKEND_URL": f"file://{self.work / 'state'}",
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            # pulumi-resource-kubernetes writes the kubeconfig, keys included, to a temporary file at
            # every Configure and never removes it (v4.25.0 provider/pkg/provider/util.go
            # writeKubeconfigToFile): here they go with the work directory.
            "TMPDIR": str(self.work / "tmp"),
        }

    def run(self, *args: str, env: Optional[dict] = None, timeout: float = COMMAND_TIMEOUT) -> Result:
        started = time.monotonic()
        done = subprocess.run(list(args), cwd=self.repo, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout)
        result = Result(list(args), done.returncode, done.stdout + done.stderr, time.monotonic() - started, done.stdout)
        self.log.append(result)
        with (self.work / "commands.log").open("a") as log:
            log.write(f"$ {' '.join(args)}  # exit {done.returncode}, {result.seconds:.1f} s\n{result.output}\n")
        return result

    def pulumi(self, *args: str, env: Optional[dict] = None) -> Result:
        return self.run("pulumi", *args, "--non-interactive", env=env)

    def python(self, *args: str, env: Optional[dict] = None) -> Result:
        return self.run(str(self.repo / ".venv" / "bin" / "python"), *args, env=env)

    @contextlib.contextmanager
    def port_forwards(self, stack: str) -> Iterator[None]:
        """What scripts/up.sh starts for `pulumi up` (`python -m infra port-forwards`), each retried
        until its service answers, as there; waits for the first connection."""
        listed = self.python("-m", "infra", "port-forwards", "--stack", stack).check().output
        processes = []
        try:
            for line in listed.splitlines():
                namespace, service, ports = line.split()
                loop = (f"until kubectl -n {namespace} port-forward svc/{service} {ports} >/dev/null 2>&1; "
                        "do sleep 2; done")
                processes.append(subprocess.Popen(["bash", "-c", loop], env=self.env, start_new_session=True))
                wait_for_port(int(ports.split(":")[0]))
            yield
        finally:
            for process in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=10)

    def preview_steps(self, stack: str) -> dict[str, dict]:
        """`pulumi preview --json`: URN -> the engine's step (op: same, update, replace,
        create-replacement, delete-replaced, create, delete, ...; diffReasons, replaceReasons)."""
        result = self.pulumi("preview", "--stack", stack, "--json").check()
        document = json.loads(result.stdout)
        return {step["urn"]: step for step in document.get("steps", [])}


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def versions_run(platform: Platform) -> dict[str, str]:
    """What actually ran: each Go binary's main module and version from its own build info (`go
    version -m`), the API server's answer, and the SDK packages of the program's virtualenv (the
    plugin versions they ask for; a plugin on PATH is used whatever they ask)."""
    def module(tool: str, binary: str) -> str:
        info = platform.run("go", "version", "-m", str(platform.tools[tool] / binary)).output
        found = re.search(r"^\s+mod\s+(\S+)\s+(\S+)", info, re.M)
        return f"{found[1]} {found[2]}" if found else "unknown"
    sdk = platform.python("-c", "import importlib.metadata as m; print(' '.join(f'{p}=={m.version(p)}' for p in "
                                "('pulumi', 'pulumi-kubernetes', 'pulumi-random')))").output.strip()
    return {
        "kubernetes": platform.cluster.version(),
        "pulumi": module("pulumi", "pulumi"),
        "pulumi-language-python": "e2e stand-in (e2e/tools/pulumi/cmd/pulumi-language-python) on "
                                  + module("pulumi", "pulumi-language-python"),
        "pulumi-resource-random": "e2e stand-in (e2e/tools/pulumi/cmd/pulumi-resource-random)",
        "pulumi-resource-kubernetes": module("pulumi-kubernetes", "pulumi-resource-kubernetes") + " (tag v4.25.0)",
        "registry": module("registry", "registry"),
        "kwok": module("kwok", "kwok"),
        "etcd": module("etcd", "etcd"),
        "python sdk": sdk,
    }


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
