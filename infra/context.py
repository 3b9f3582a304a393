"""What every area of the program is given (infra/program.py builds it): its own module, so the
areas can name it without importing the program that imports them."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from components.kept_secret import Cluster
from infra import config as stack_config
from infra.engine_paths import from_program

ROOT = Path(__file__).resolve().parent.parent
"""The directory of Pulumi.yaml; paths in stack config (entity sources, renderYamlToDirectory)
are relative to it."""

STACK_DIR: Path = ROOT
"""The directory of the stack files (the engine's: beside Pulumi.yaml). The program reads the other
stack files there: a cluster owner's (`platform.clusterOwnerStack`), a worker's main stack
(`remoteScheduler.mainStack`) and every stack naming this one as its owner. Only an offline render
of stack files kept elsewhere changes it, for the run (cloudstation_tools/render.py
`render(stack_dir=...)`: the tests' fixture stacks, tests/stacks/)."""


def stack_files_dir() -> Path:
    return STACK_DIR


@dataclass(frozen=True)
class StackContext:
    """What every area needs: the validated config, the stack name and the Kubernetes provider."""

    config: stack_config.StackConfig
    stack: str
    provider: k8s.Provider
    root: Path = ROOT
    stack_dir: Path = field(default_factory=stack_files_dir)
    """Where the other stack files are (STACK_DIR)."""
    cwd: Path = field(default_factory=Path.cwd)
    """The program's working directory, which the engine also starts every provider in
    (Pulumi.yaml's `main`: none, the project root): path inputs are relative to it (infra/engine_paths.py)."""
    shared: dict = field(default_factory=dict, compare=False)
    """What one area hands to a later one (infra/areas.py order): the registry access the builds
    namespace needs, the Armada access the entity builds need (infra/builds.py)."""

    def path(self, from_root: str | Path) -> str:
        """A path of the stack config (relative to root) as a provider input (relative to cwd)."""
        return from_program(from_root, self.root, self.cwd)

    @property
    def opts(self) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(provider=self.provider)

    @property
    def cluster(self) -> Optional[Cluster]:
        """Where kept Secrets are read back (components/kept_secret.py): the stack's kube context, as
        its Kubernetes provider reaches the cluster; None when it renders YAML to a directory (no
        cluster, and the current context may be another one)."""
        kubernetes = self.config.kubernetes
        return None if kubernetes.render_yaml_to_directory is not None else Cluster(kubernetes.context)
