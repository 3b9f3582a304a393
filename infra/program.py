"""The Pulumi program: validate the stack config, then build each area of the platform.

Every area module exposes `deploy(stack: StackContext) -> dict[str, Output]` returning the stack
outputs it contributes. Nothing is registered before the whole config has been validated.
"""
from __future__ import annotations

import gc
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s
from pulumi.runtime.config import CONFIG, get_config_env, get_config_secret_keys_env, is_config_secret

from infra import config as stack_config
from infra.engine_paths import from_program
from infra import context
from infra.context import ROOT, StackContext  # noqa: F401  (re-exported: callers name them here)


def read_config() -> stack_config.StackConfig:
    """The stack's config, validated; a bad config stops the program before any resource."""
    raw = {**get_config_env(), **CONFIG.get()}
    try:
        return stack_config.load(raw, root=ROOT, stack_dir=context.stack_files_dir(),
                                 source=f"Pulumi.{pulumi.get_stack()}.yaml", secret_keys=secret_keys(raw))
    except stack_config.ConfigError as error:
        raise pulumi.RunError(str(error)) from None


def secret_keys(raw: dict) -> set[str]:
    """The config keys the engine passed as secrets (`secure:` in the stack file).

    The language host always sets PULUMI_CONFIG_SECRET_KEYS, `[]` when there are none
    (pulumi/pulumi sdk/python/cmd/pulumi-language-python/main.go `constructConfigSecretKeys`), and
    the SDK reads it with `get_config_secret_keys_env`; under mocks `set_all_config(values,
    secret_keys)` fills the set `is_config_secret` checks (pulumi 3.272.0 pulumi/runtime/config.py)."""
    return set(get_config_secret_keys_env()) | {key for key in raw if is_config_secret(key)}


def provider_args(kubernetes: stack_config.KubernetesConfig, root: Path = ROOT, cwd: Path | None = None) -> dict:
    """The Kubernetes provider's inputs; `renderYamlToDirectory` relative to `cwd` (default: the
    working directory), where the engine starts the provider that writes there."""
    # Secrets update in place: by default pulumi-kubernetes replaces a Secret whose data changes
    # (provider/pkg/provider/diff.go `forceNewProperties`), and a kept one (retainOnDelete: the
    # registry's and stores' credentials) cannot be replaced under its name, since the engine skips
    # its delete (pulumi/pulumi step.go `DeleteStep.Apply`): a rotated password would fail the up.
    args: dict = {"enable_server_side_apply": True, "enable_secret_mutable": True}
    if kubernetes.context:
        args["context"] = kubernetes.context
    if kubernetes.render_yaml_to_directory:
        directory = kubernetes.render_yaml_to_directory
        args["render_yaml_to_directory"] = from_program(directory, root, cwd or Path.cwd())
    return args


def main() -> None:
    config = read_config()
    # Registering a stack is a short batch whose objects (resources, their Outputs, futures and
    # tasks) nearly all live until it ends: the cyclic collector's repeated passes over that growing
    # heap took ~40% of a 500-entity stack's run and freed little (bench/render_cost.py). The
    # process ends with the deployment; cloudstation_tools/render.py, which runs the program inside a longer
    # one, turns the collector back on afterwards.
    gc.disable()
    cwd = Path.cwd()
    provider = k8s.Provider("kubernetes", **provider_args(config.kubernetes, ROOT, cwd))
    stack = StackContext(config=config, stack=pulumi.get_stack(), provider=provider, cwd=cwd)

    # Areas are imported here so that a bad config fails before their modules do any work.
    from infra import areas

    for deploy in areas.AREAS:
        for name, value in deploy(stack).items():
            pulumi.export(name, value)
