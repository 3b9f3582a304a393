"""Offline render: run the real program under Pulumi's mocks and write what it would deploy.

No Pulumi CLI, cluster, Docker engine or network is used. `render(stack)` evaluates
`infra/__main__.py` with the config of `Pulumi.<stack>.yaml` (secure values replaced by fakes)
and returns every registration; `write()` turns that into

    manifests.yaml   every Kubernetes object, in apply order (namespaces and CRDs first)
    resources.json   every Pulumi resource: type, name, parent, provider, dependencies, the
                     options the engine acts on (protect, deleteBeforeReplace, ...), inputs
    outputs.json     the stack outputs

with every secret value replaced by "[secret]".
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi.runtime.settings
import yaml

from infra import config as stack_config
from infra import engine_paths
from infra import stack_yaml
from infra.mocks import ProgramMocks, RecordingMonitor, Registration, is_wrapped_secret

ROOT = Path(__file__).resolve().parent.parent
SECRET = "[secret]"

# Apply order by kind (after Helm's install order); kinds not listed (custom resources) go last.
KIND_ORDER = [
    "Namespace", "CustomResourceDefinition", "PriorityClass", "StorageClass", "NetworkPolicy",
    "ResourceQuota", "LimitRange", "PodDisruptionBudget", "ServiceAccount", "Secret", "ConfigMap",
    "PersistentVolume", "PersistentVolumeClaim", "ClusterRole", "ClusterRoleBinding", "Role",
    "RoleBinding", "Service", "DaemonSet", "Pod", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler",
    "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress", "APIService",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
]
NOT_OBJECTS = ("kubernetes:yaml/", "kubernetes:helm.sh/", "kubernetes:kustomize")


@dataclass
class StackFile:
    """A stack file's config as the engine would pass it: full key -> string, plus secret keys."""

    values: dict[str, str]
    secret_keys: list[str]

    @classmethod
    def read(cls, stack: str, root: Path = ROOT) -> "StackFile":
        path = root / f"Pulumi.{stack}.yaml"
        if not path.is_file():
            raise FileNotFoundError(f"no stack file {path.name} in {root}")
        # Read as the CLI reads it; a malformed file is a ConfigError naming file and line (infra/stack_yaml.py).
        values, secret_keys = {}, []
        for key, value in stack_yaml.read(path).items():
            if stack_yaml.is_secure(value):
                values[key] = f"fake-secret-for-{key}"
                secret_keys.append(key)
            else:
                values[key] = value if isinstance(value, str) else json.dumps(value)
        return cls(values, secret_keys)


@dataclass
class Rendered:
    stack: str
    registrations: list[Registration]
    outputs: dict[str, Any]

    def of_type(self, type_: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_]

    def resources(self) -> list[dict]:
        return [
            {
                "urn": r.urn,
                "type": r.type,
                "name": r.name,
                "custom": r.custom,
                "parent": r.parent or None,
                "provider": r.provider or None,
                "dependsOn": sorted(r.dependencies),
                "options": r.options,
                "inputs": clean(r.inputs),
            }
            for r in self.registrations
        ]

    def manifests(self) -> list[dict]:
        objects = [
            canonical(clean(r.inputs))
            for r in self.registrations
            if r.custom and r.type.startswith("kubernetes:") and not r.type.startswith(NOT_OBJECTS)
        ]
        return sorted(objects, key=apply_order)


def apply_order(obj: dict) -> tuple:
    kind = obj.get("kind", "")
    rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    meta = obj.get("metadata") or {}
    return (rank, kind, meta.get("namespace") or "", meta.get("name") or "")


def canonical(obj: dict) -> dict:
    """apiVersion, kind, metadata first, everything else after, keys sorted below the top."""
    first = [k for k in ("apiVersion", "kind", "metadata") if k in obj]
    return {k: _sorted(obj[k]) for k in first + sorted(k for k in obj if k not in first)}


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def redact(value: Any) -> Any:
    """A secret's shape with every leaf replaced, so objects stay schema-valid (a secret map
    such as a Secret's stringData keeps its keys)."""
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return SECRET


def clean(value: Any) -> Any:
    """Mock artefacts out: secrets redacted, integral floats back to ints, unknowns marked."""
    if is_wrapped_secret(value):
        return redact(value["value"])
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if type(value).__name__ == "Unknown":
        return "[unknown]"
    return value


def validate_config(stack: str, root: Path = ROOT) -> stack_config.StackConfig:
    """Validate a stack file's config; raises ConfigError with every problem."""
    stack_file = StackFile.read(stack, root)
    return stack_config.load(stack_file.values, root=root, source=f"Pulumi.{stack}.yaml",
                             secret_keys=stack_file.secret_keys)


def render(stack: str, root: Path = ROOT, stack_file: StackFile | None = None) -> Rendered:
    """Run `infra/__main__.py` for `stack` under mocks (preview=False) and collect everything."""
    stack_file = stack_file or StackFile.read(stack, root)
    stack_config.load(stack_file.values, root=root, source=f"Pulumi.{stack}.yaml", secret_keys=stack_file.secret_keys)

    mocks = ProgramMocks()
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.settings.ROOT.set(None)  # a fresh root stack, so exports don't accumulate
    pulumi.runtime.set_mocks(mocks, project=stack_config.PROJECT, stack=stack, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(stack_file.values, stack_file.secret_keys)
    outputs: dict[str, Any] = {}

    async def collect_outputs() -> None:
        root_stack = pulumi.runtime.settings.get_root_resource()
        for name, value in root_stack.outputs.items():
            output = pulumi.Output.from_input(value)
            secret = await output.is_secret()
            outputs[name] = SECRET if secret else clean(await output.future())

    # The engine runs the program in the directory Pulumi.yaml's `main` names, and path inputs
    # are relative to it (infra/engine_paths.py); run it there, whatever the caller's cwd.
    program_dir, main = engine_paths.program_entry(root)

    @pulumi.runtime.test
    def run():
        runpy.run_path(str(program_dir / main), run_name="__main__")
        return pulumi.Output.from_input(asyncio.ensure_future(collect_outputs()))

    with contextlib.chdir(program_dir):
        run()
    registrations = sorted(mocks.registrations, key=lambda r: r.urn)
    return Rendered(stack=stack, registrations=registrations, outputs=dict(sorted(outputs.items())))


def write(rendered: Rendered, out: Path) -> None:
    """Write manifests.yaml, resources.json and outputs.json into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    documents = yaml.safe_dump_all(rendered.manifests(), sort_keys=False, default_flow_style=False)
    _atomic_write(out / "manifests.yaml", documents)
    _atomic_write(out / "resources.json", json.dumps(rendered.resources(), indent=2, sort_keys=True) + "\n")
    _atomic_write(out / "outputs.json", json.dumps(rendered.outputs, indent=2, sort_keys=True) + "\n")


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)
