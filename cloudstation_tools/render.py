"""Offline render: run the real program under Pulumi's mocks and write what it would deploy.

No Pulumi CLI, cluster, Docker engine or network is used. `render(stack)` evaluates
the program (`__main__.py`) with the config of `Pulumi.<stack>.yaml` (secure values replaced by fakes)
and returns every registration; `write()` turns that into

    manifests.yaml   every Kubernetes object, in apply order (namespaces and CRDs first), each
                     under a comment naming the component that made it and the values the mocks
                     made up (cloudstation_tools/render_output.py)
    resources.json   every Pulumi resource: type, name, parent, provider, dependencies, the
                     options the engine acts on (protect, deleteBeforeReplace, ...), inputs
    outputs.json     the stack outputs

with every secret value replaced by "[secret]".
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi.runtime.settings

from infra import config as stack_config
from infra import context
from infra import engine_paths
from infra import stack_yaml
from cloudstation_tools import render_output
from cloudstation_tools.mocks import ProgramMocks, RecordingMonitor, Registration
from cloudstation_tools.render_output import KIND_ORDER, NOT_OBJECTS, SECRET, apply_order, canonical, clean, redact  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


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
    made_up: dict[str, str] = field(default_factory=dict)
    """Non-secret values the mocks made up (image digests) -> what made each (cloudstation_tools/mocks.py)."""
    reads: dict[str, str] = field(default_factory=dict)
    """URN -> `<type> <id>` of each existing object the program read, whose state the mock made up."""

    def of_type(self, type_: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_]

    def resources(self) -> list[dict]:
        return render_output.resources(self.registrations)

    def manifests(self) -> list[dict]:
        return [obj for _, obj in render_output.objects(self.registrations)]

    def object_count(self) -> int:
        """How many Kubernetes objects manifests() holds, without building them."""
        return sum(1 for r in self.registrations if render_output.is_object(r))

    def manifests_yaml(self) -> str:
        """manifests.yaml's text: the objects with their comments (cloudstation_tools/render_output.py)."""
        return render_output.manifests_yaml(self.stack, render_output.objects(self.registrations), self.made_up, self.reads)


def validate_config(stack: str, root: Path = ROOT, require_images: bool = True,
                    stack_dir: Path | None = None) -> stack_config.StackConfig:
    """Validate a stack file's config (`Pulumi.<stack>.yaml` in `stack_dir`, default `root`); raises
    ConfigError with every problem. `require_images=False` reads a prod stack before (or between)
    promotions for its other settings."""
    stack_dir = stack_dir or root
    stack_file = StackFile.read(stack, stack_dir)
    return stack_config.load(stack_file.values, root=root, stack_dir=stack_dir, source=f"Pulumi.{stack}.yaml",
                             secret_keys=stack_file.secret_keys, require_images=require_images)


def render(stack: str, root: Path = ROOT, stack_file: StackFile | None = None, mocks: ProgramMocks | None = None,
           preview: bool = False, stack_dir: Path | None = None) -> Rendered:
    """Run the program (`__main__.py`) for `stack` under mocks (preview=False unless asked) and collect
    everything. `mocks` may carry an opt-in (ProgramMocks.dynamic: run dynamic providers for real);
    its `registrations` hold what was registered even when the program fails. The stack files are
    read from `stack_dir` (default `root`, where the engine keeps them): `stack_file`, unless given,
    and the other stack files the program reads (infra/context.py STACK_DIR)."""
    stack_dir = stack_dir or root
    stack_file = stack_file or StackFile.read(stack, stack_dir)
    stack_config.load(stack_file.values, root=root, stack_dir=stack_dir, source=f"Pulumi.{stack}.yaml",
                      secret_keys=stack_file.secret_keys)

    mocks = mocks if mocks is not None else ProgramMocks()
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.settings.ROOT.set(None)  # a fresh root stack, so exports don't accumulate
    pulumi.runtime.set_mocks(mocks, project=stack_config.PROJECT, stack=stack, preview=preview, monitor=monitor)
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

    collecting = gc.isenabled()  # the program turns the cyclic collector off (infra/program.py main)
    stack_files, context.STACK_DIR = context.STACK_DIR, Path(stack_dir)
    try:
        with contextlib.chdir(program_dir):
            run()
    finally:
        context.STACK_DIR = stack_files
        if collecting:
            gc.enable()
    registrations = sorted(mocks.registrations, key=lambda r: r.urn)
    return Rendered(stack=stack, registrations=registrations, outputs=dict(sorted(outputs.items())),
                    made_up=dict(sorted(mocks.made_up.items())), reads=dict(sorted(mocks.reads.items())))


def write(rendered: Rendered, out: Path) -> None:
    """Write manifests.yaml, resources.json and outputs.json into `out` (cloudstation_tools/render_output.py)."""
    render_output.write(out, rendered.stack, rendered.registrations, rendered.outputs, rendered.made_up, rendered.reads)
