"""The Pulumi program: validate the stack config, then build each area of the platform.

Every area module exposes `deploy(stack: StackContext) -> dict[str, Output]` returning the stack
outputs it contributes. Nothing is registered before the whole config has been validated.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s
from pulumi.runtime.config import CONFIG, get_config_env

from infra import config as stack_config

ROOT = Path(__file__).resolve().parent.parent
"""The directory of Pulumi.yaml; entity source paths are relative to it."""


@dataclass(frozen=True)
class StackContext:
    """What every area needs: the validated config, the stack name and the Kubernetes provider."""

    config: stack_config.StackConfig
    stack: str
    provider: k8s.Provider
    root: Path = ROOT

    @property
    def opts(self) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(provider=self.provider)


def read_config() -> stack_config.StackConfig:
    """The stack's config, validated; a bad config stops the program before any resource."""
    raw = {**get_config_env(), **CONFIG.get()}
    try:
        return stack_config.load(raw, root=ROOT, source=f"Pulumi.{pulumi.get_stack()}.yaml")
    except stack_config.ConfigError as error:
        raise pulumi.RunError(str(error)) from None


def provider_args(kubernetes: stack_config.KubernetesConfig) -> dict:
    args: dict = {"enable_server_side_apply": True}
    if kubernetes.context:
        args["context"] = kubernetes.context
    if kubernetes.render_yaml_to_directory:
        args["render_yaml_to_directory"] = kubernetes.render_yaml_to_directory
    return args


def main() -> None:
    config = read_config()
    provider = k8s.Provider("kubernetes", **provider_args(config.kubernetes))
    stack = StackContext(config=config, stack=pulumi.get_stack(), provider=provider)

    # Areas are imported here so that a bad config fails before their modules do any work.
    from infra import areas

    for deploy in areas.AREAS:
        for name, value in deploy(stack).items():
            pulumi.export(name, value)
