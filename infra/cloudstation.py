"""CloudStation: the platform namespace and one environment per project."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi

from components.namespace import Namespace, NamespaceArgs

if TYPE_CHECKING:
    from infra.program import StackContext


def project_namespace(project: str, environment: str) -> str:
    return f"{project}-{environment}"


def deploy(stack: "StackContext") -> dict[str, pulumi.Output]:
    config = stack.config
    platform = Namespace("platform", NamespaceArgs(name=config.platform.namespace), stack.opts)
    namespaces = {}
    for project in config.projects:
        name = project_namespace(project.name, config.environment.value)
        namespaces[project.name] = Namespace(f"project-{project.name}", NamespaceArgs(name=name), stack.opts).name
    return {"platformNamespace": platform.name, "projectNamespaces": pulumi.Output.all(**namespaces)}
